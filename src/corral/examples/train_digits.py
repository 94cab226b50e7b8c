"""A small real training run for the demo: an MLP on scikit-learn's digits (ships offline).

Prints progress per epoch and the final test accuracy; exits non-zero if the model did not learn,
so a broken environment shows up as a failed job rather than a silent success.
Run: python -m corral.examples.train_digits [--epochs N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=int(os.environ.get("EPOCHS", "30")))
    parser.add_argument("--min-accuracy", type=float, default=0.85)
    args = parser.parse_args(argv)

    import numpy as np
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.preprocessing import StandardScaler

    print(f"job {os.environ.get('CORRAL_JOB_ID', '-')} rank {os.environ.get('RANK', '0')}", flush=True)
    print(
        f"GPUs allocated: {os.environ.get('CUDA_VISIBLE_DEVICES') or 'none'} (training runs on CPU)",
        flush=True,
    )
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    x_train, x_test = scaler.transform(x_train), scaler.transform(x_test)
    model = MLPClassifier(hidden_layer_sizes=(64,), learning_rate_init=1e-3, random_state=0)
    classes = np.unique(y)
    started = time.monotonic()
    accuracy = 0.0
    for epoch in range(1, args.epochs + 1):
        model.partial_fit(x_train, y_train, classes=classes)
        accuracy = float(model.score(x_test, y_test))
        print(f"epoch {epoch:3d}  loss {model.loss_:.4f}  test accuracy {accuracy:.3f}", flush=True)
    print(f"done in {time.monotonic() - started:.1f} s; final test accuracy {accuracy:.3f}", flush=True)
    return 0 if accuracy >= args.min_accuracy else 1


if __name__ == "__main__":
    sys.exit(main())
