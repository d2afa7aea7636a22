"""The config's sections, one module each: ``[job]``, ``[launcher]``, ``[program]`` with
``[[steps]]``, ``[fabric]`` with ``[kubernetes]``. config/models.py assembles them."""
