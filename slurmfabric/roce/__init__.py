"""RoCE lossless setup: what each RoCE port is configured to do (facts.py, from sysfs and the
standard tools; parse.py reads their output), whether that matches the site's profile
(profile.py), and the same across a cluster (audit.py)."""
