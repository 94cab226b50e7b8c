"""Counts in words for messages (the CLI's, the scheduler's reasons, the services' errors): "1 file",
"2 files", never "1 files" or "file(s)". A leaf module, so that the pure scheduler may use it too."""

from __future__ import annotations


def plural(count: float, noun: str, many: str | None = None) -> str:
    """`count` and `noun`, the noun plural unless the count is exactly one: plural(1, "file") is
    "1 file", plural(0, "file") "0 files". `many` for a plural that is not noun + "s"
    (plural(2, "is", "are")). A whole float shows without its ".0" (1.0 CPUs is "1 CPU")."""
    text = f"{count:g}" if isinstance(count, float) else str(count)
    return f"{text} {noun if count == 1 else (many or noun + 's')}"


def gpu_noun(model: str) -> str:
    """A GPU of `model` (a model name or names joined with "|"): "A100 GPU", but "GPU" for the
    simulator's pools without a gpu_model, whose model is called "GPU" (not "GPU GPU")."""
    return "GPU" if model.upper() in ("GPU", "") else f"{model} GPU"


def gpus_of(count: float, model: str) -> str:
    """`count` GPUs of `model`: "8 A100 GPUs", "8 GPUs" (gpu_noun)."""
    return plural(count, gpu_noun(model))
