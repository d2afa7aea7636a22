"""Run: each rank's environment, addresses, ports, binding, whichever launcher started it."""
