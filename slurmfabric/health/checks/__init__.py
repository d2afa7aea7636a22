"""The health check families: each collects facts and gates them."""
