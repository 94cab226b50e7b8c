"""`python -m corral`: the `corral` command, as the console script runs it ([project.scripts]
corral = "corral.cli.main:main"), for an environment whose scripts directory is not on PATH."""

from corral.cli.main import main

if __name__ == "__main__":
    main()
