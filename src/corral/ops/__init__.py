"""Operations on an installation rather than on jobs: backup and restore of the database, host
checks (`corral doctor`). Used by the `corral admin` and `corral doctor` commands."""
