"""catalog: job_templates, template_versions (job templates), registered_models, model_versions
and job_models (the model registry and the model versions jobs mount)

Revision ID: 0012_catalog
Revises: 0011_environments
Create Date: 2026-11-25 18:34:32.721302
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_catalog"
down_revision = "0011_environments"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_templates",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner_user_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("visibility", sa.String(length=8), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("uses", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_id"], ["groups.id"], name=op.f("fk_job_templates_group_id_groups"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["owner_user_id"],
            ["users.id"],
            name=op.f("fk_job_templates_owner_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_templates")),
        sa.UniqueConstraint("name", name=op.f("uq_job_templates_name")),
    )
    with op.batch_alter_table("job_templates", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_job_templates_group_id"), ["group_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_templates_owner_user_id"), ["owner_user_id"], unique=False)

    op.create_table(
        "registered_models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("owner_user_id", sa.Integer(), nullable=False),
        sa.Column("group_id", sa.Integer(), nullable=True),
        sa.Column("visibility", sa.String(length=8), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["groups.id"],
            name=op.f("fk_registered_models_group_id_groups"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["owner_user_id"],
            ["users.id"],
            name=op.f("fk_registered_models_owner_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_registered_models")),
        sa.UniqueConstraint("name", name=op.f("uq_registered_models_name")),
    )
    with op.batch_alter_table("registered_models", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_registered_models_group_id"), ["group_id"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_registered_models_owner_user_id"), ["owner_user_id"], unique=False
        )

    op.create_table(
        "job_models",
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("model_version_id", sa.Integer(), nullable=False),
        sa.Column("model_name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_models_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "model_version_id", name=op.f("pk_job_models")),
    )
    with op.batch_alter_table("job_models", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_job_models_model_version_id"), ["model_version_id"], unique=False
        )

    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=16), nullable=False),
        sa.Column("framework", sa.String(length=64), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("card", sa.Text(), nullable=False),
        sa.Column("source_path", sa.String(length=1024), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.BigInteger(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("source_job_id", sa.Integer(), nullable=False),
        sa.Column("lineage", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["registered_models.id"],
            name=op.f("fk_model_versions_model_id_registered_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_versions")),
        sa.UniqueConstraint("model_id", "version", name=op.f("uq_model_versions_model_id")),
    )
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_versions_model_id"), ["model_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_model_versions_source_job_id"), ["source_job_id"], unique=False)

    op.create_table(
        "template_versions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("template_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("source_job_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("created_by", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(
            ["template_id"],
            ["job_templates.id"],
            name=op.f("fk_template_versions_template_id_job_templates"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_template_versions")),
        sa.UniqueConstraint("template_id", "version", name=op.f("uq_template_versions_template_id")),
    )
    with op.batch_alter_table("template_versions", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_template_versions_template_id"), ["template_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("template_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_template_versions_template_id"))

    op.drop_table("template_versions")
    with op.batch_alter_table("model_versions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_versions_source_job_id"))
        batch_op.drop_index(batch_op.f("ix_model_versions_model_id"))

    op.drop_table("model_versions")
    with op.batch_alter_table("job_models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_models_model_version_id"))

    op.drop_table("job_models")
    with op.batch_alter_table("registered_models", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_registered_models_owner_user_id"))
        batch_op.drop_index(batch_op.f("ix_registered_models_group_id"))

    op.drop_table("registered_models")
    with op.batch_alter_table("job_templates", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_templates_owner_user_id"))
        batch_op.drop_index(batch_op.f("ix_job_templates_group_id"))

    op.drop_table("job_templates")
