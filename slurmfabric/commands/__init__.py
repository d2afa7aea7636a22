"""One module per subcommand, each with ``main(argv) -> int``; see ``slurmfabric.cli``."""
