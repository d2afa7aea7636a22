"""Shared helpers of every front: probes, records, sysfs, files, text rules."""
