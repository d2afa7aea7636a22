"""The Slurm layer: every Slurm command's argv and parser, hostlists."""
