"""The `corral` command line (Typer + Rich). Each area registers its commands in its own module."""
