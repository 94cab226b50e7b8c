"""Catalogues: job templates (corral.catalog.templates) and the model registry
(corral.catalog.models, its files in corral.catalog.model_files, its mount source in
corral.catalog.model_mounts). docs/catalogues.md."""
