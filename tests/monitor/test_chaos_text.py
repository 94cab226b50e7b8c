"""What `corral chaos gpu ...` prints after an injection (into a real fault file, `--home`): the
GPU's faults as key=value pairs. It printed the entry as a Python dict, with unix times and floats
to 16 digits ("{'ecc_corrected_per_s': 0.03333333333333333, 'ecc_corrected_since': 1796...}")."""

from __future__ import annotations

import time
from pathlib import Path

from typer.testing import CliRunner

from corral.cli.main import app
from corral.monitor.gpu import read_faults


def chaos(home: Path, *args: str) -> str:
    result = CliRunner().invoke(app, ["chaos", "gpu", *args, "--home", str(home)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output.strip()


def test_an_injection_prints_the_gpus_faults_as_key_value_pairs(tmp_path: Path) -> None:
    out = chaos(tmp_path, "ecc", "n1", "2", "--rate", "2/m")
    since = read_faults(tmp_path)["n1/2"]["ecc_corrected_since"]
    local = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
    assert out == f"GPU 2 on n1: ecc_corrected_per_s=0.03333, ecc_corrected_since={local}"
    chaos(tmp_path, "xid", "n1", "0")
    chaos(tmp_path, "xid", "n1", "0", "48")
    assert chaos(tmp_path, "lose", "n1", "0") == "GPU 0 on n1: xids=79,48, lost=yes"
    assert chaos(tmp_path, "temp", "n1", "1", "95") == "GPU 1 on n1: temperature_c=95"
    assert chaos(tmp_path, "clear", "n1", "1") == "GPU 1 on n1: no faults"
