"""datasets: datasets, dataset_versions, dataset_shares, dataset_uploads, dataset_upload_files,
job_datasets (lineage) and storage_accounts (storage quotas and usage)

Revision ID: 0010_datasets
Revises: 0009_secrets
Create Date: 2026-11-25 15:20:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_datasets"
down_revision = "0009_secrets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "datasets",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner_user_id", sa.Integer(), nullable=True),
        sa.Column("owner_group_id", sa.Integer(), nullable=True),
        sa.Column("public", sa.Boolean(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_group_id"],
            ["groups.id"],
            name=op.f("fk_datasets_owner_group_id_groups"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner_user_id"], ["users.id"], name=op.f("fk_datasets_owner_user_id_users"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_datasets")),
        sa.UniqueConstraint("name", name=op.f("uq_datasets_name")),
    )
    op.create_index(op.f("ix_datasets_owner_group_id"), "datasets", ["owner_group_id"], unique=False)
    op.create_index(op.f("ix_datasets_owner_user_id"), "datasets", ["owner_user_id"], unique=False)
    op.create_table(
        "dataset_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_dataset_versions_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_versions")),
        sa.UniqueConstraint("dataset_id", "version", name=op.f("uq_dataset_versions_dataset_id")),
    )
    op.create_index(op.f("ix_dataset_versions_dataset_id"), "dataset_versions", ["dataset_id"], unique=False)
    op.create_table(
        "dataset_shares",
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["dataset_id"],
            ["datasets.id"],
            name=op.f("fk_dataset_shares_dataset_id_datasets"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["group_id"], ["groups.id"], name=op.f("fk_dataset_shares_group_id_groups"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("dataset_id", "group_id", name=op.f("pk_dataset_shares")),
    )
    op.create_table(
        "dataset_uploads",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("dataset_name", sa.String(length=64), nullable=False),
        sa.Column("owner_user_id", sa.Integer(), nullable=True),
        sa.Column("owner_group_id", sa.Integer(), nullable=True),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.Column("declared_bytes", sa.BigInteger(), nullable=False),
        sa.Column("declared_files", sa.BigInteger(), nullable=False),
        sa.Column("manifest_digest", sa.String(length=64), nullable=False),
        sa.Column("registered_bytes", sa.BigInteger(), nullable=False),
        sa.Column("registered_files", sa.BigInteger(), nullable=False),
        sa.Column("received_bytes", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("version", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["owner_group_id"],
            ["groups.id"],
            name=op.f("fk_dataset_uploads_owner_group_id_groups"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["owner_user_id"],
            ["users.id"],
            name=op.f("fk_dataset_uploads_owner_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dataset_uploads")),
    )
    op.create_index(
        op.f("ix_dataset_uploads_dataset_name"), "dataset_uploads", ["dataset_name"], unique=False
    )
    op.create_table(
        "dataset_upload_files",
        sa.Column("upload_id", sa.String(length=32), nullable=False),
        sa.Column("path", sa.String(length=1024), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("received", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["upload_id"],
            ["dataset_uploads.id"],
            name=op.f("fk_dataset_upload_files_upload_id_dataset_uploads"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("upload_id", "path", name=op.f("pk_dataset_upload_files")),
    )
    op.create_table(
        "job_datasets",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("dataset_name", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_datasets_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "dataset_id", "version", name=op.f("pk_job_datasets")),
    )
    op.create_index(op.f("ix_job_datasets_dataset_id"), "job_datasets", ["dataset_id"], unique=False)
    op.create_table(
        "storage_accounts",
        sa.Column("scope", sa.String(length=8), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("max_bytes", sa.BigInteger(), nullable=True),
        sa.Column("max_files", sa.BigInteger(), nullable=True),
        sa.Column("dataset_bytes", sa.BigInteger(), nullable=False),
        sa.Column("dataset_files", sa.BigInteger(), nullable=False),
        sa.Column("scanned_bytes", sa.BigInteger(), nullable=False),
        sa.Column("scanned_files", sa.BigInteger(), nullable=False),
        sa.Column("scanned_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("scope", "name", name=op.f("pk_storage_accounts")),
    )


def downgrade() -> None:
    op.drop_table("storage_accounts")
    op.drop_index(op.f("ix_job_datasets_dataset_id"), table_name="job_datasets")
    op.drop_table("job_datasets")
    op.drop_table("dataset_upload_files")
    op.drop_index(op.f("ix_dataset_uploads_dataset_name"), table_name="dataset_uploads")
    op.drop_table("dataset_uploads")
    op.drop_table("dataset_shares")
    op.drop_index(op.f("ix_dataset_versions_dataset_id"), table_name="dataset_versions")
    op.drop_table("dataset_versions")
    op.drop_index(op.f("ix_datasets_owner_user_id"), table_name="datasets")
    op.drop_index(op.f("ix_datasets_owner_group_id"), table_name="datasets")
    op.drop_table("datasets")
