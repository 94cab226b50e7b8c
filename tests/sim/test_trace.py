from __future__ import annotations

import math
from pathlib import Path

import pytest

from corral.sim.trace import TraceError, TraceJob, load_generic_csv, load_trace, write_generic_csv


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(text)
    return path


def test_generic_csv_round_trip_and_defaults(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "submit_time,duration,num_gpus,group,instances,gpu_model,priority\n"
        "10,100,16,vision,2,A100,high\n0,5,1,nlp,,,\n",
    )
    tr = load_generic_csv(path)
    assert [j.job_id for j in tr.jobs] == ["job-1", "job-0"]  # sorted by submit time
    big = tr.jobs[1]
    assert (big.instances, big.gpus_per_instance, big.gpu_model, big.priority.name) == (2, 8, "A100", "HIGH")
    assert (tr.jobs[0].instances, tr.jobs[0].cpus, tr.jobs[0].memory_mib) == (1, 1.0, 1024)
    out = tmp_path / "out.csv"
    write_generic_csv(tr.jobs, out)
    assert load_generic_csv(out).jobs == tr.jobs


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("0,10,1\n", r"t.csv: line 2: expected 4 columns, found 3 \(column 'group' is missing\)"),
        ("0,-5,1,g\n", r"t.csv: line 2: column 'duration': -5 is below the minimum 0"),
        ("0,10,two,g\n", r"t.csv: line 2: column 'num_gpus': 'two' is not a number"),
        ("0,10,1.5,g\n", r"t.csv: line 2: column 'num_gpus': '1.5' is not a whole number"),
        ("0,10,1,g\nx,10,1,g\n", r"t.csv: line 3: column 'submit_time': 'x' is not a number"),
        ("0,10,1,\n", r"t.csv: line 2: column 'group': value is missing"),
    ],
)
def test_malformed_rows_name_file_line_and_column(tmp_path: Path, body: str, expected: str) -> None:
    path = write(tmp_path, "submit_time,duration,num_gpus,group\n" + body)
    with pytest.raises(TraceError, match=expected):
        load_generic_csv(path)


def test_missing_required_column_and_empty_traces(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"line 1: missing required column\(s\) group"):
        load_generic_csv(write(tmp_path, "submit_time,duration,num_gpus\n0,1,1\n"))
    with pytest.raises(TraceError, match="the trace is empty"):
        load_generic_csv(write(tmp_path, ""))
    with pytest.raises(TraceError, match="header but no jobs"):
        load_generic_csv(write(tmp_path, "submit_time,duration,num_gpus,group\n"))
    with pytest.raises(TraceError, match="not a shipped trace"):
        load_trace(str(tmp_path / "nope.csv"))


def test_instances_must_divide_gpus(tmp_path: Path) -> None:
    path = write(tmp_path, "submit_time,duration,num_gpus,group,instances\n0,1,5,g,2\n")
    with pytest.raises(TraceError, match="line 2: column 'instances': num_gpus 5 is not divisible by 2"):
        load_generic_csv(path)


def test_philly_loader_converts_the_shipped_table() -> None:
    tr = load_trace("philly")
    assert len(tr.jobs) == 82_247
    assert len({j.group for j in tr.jobs}) == 15
    assert tr.jobs[0].submit_time == 0.0
    assert 108 < tr.jobs[-1].submit_time / 86400 < 109
    multi = [j for j in tr.jobs if j.num_gpus > 8]
    assert multi and all(j.instances > 1 and j.gpus_per_instance <= 8 for j in multi)
    assert all(j.instances == 1 for j in tr.jobs if j.num_gpus <= 8)


def test_openb_loader_rounds_fractional_gpus_and_keeps_constraints() -> None:
    tr = load_trace("openb")
    assert len(tr.jobs) == 8_152 - 1_088  # CPU-only pods left out
    assert {j.group for j in tr.jobs} == {"LS", "BE", "Burstable", "Guaranteed"}
    assert all(isinstance(j, TraceJob) and j.num_gpus in (1, 2, 4, 8) for j in tr.jobs)
    assert any("rounded up to 1 whole GPU" in n for n in tr.notes)
    pod1 = next(j for j in tr.jobs if j.job_id == "openb-pod-0001")  # gpu_milli 460 -> 1 GPU
    assert (pod1.num_gpus, pod1.cpus, pod1.memory_mib) == (1, 6.0, 12288)
    constrained = load_trace("openb-gpuspec33")
    models = {j.gpu_model for j in constrained.jobs if j.gpu_model}
    assert any("|" in m for m in models)


def test_speed_up_arrivals_divides_submit_times() -> None:
    from corral.sim.trace import Trace, speed_up_arrivals

    tr = Trace("t", (TraceJob("a", 0, 5, 1, "g"), TraceJob("b", 100, 5, 1, "g")))
    fast = speed_up_arrivals(tr, 4)
    assert [j.submit_time for j in fast.jobs] == [0, 25] and [j.duration for j in fast.jobs] == [5, 5]
    with pytest.raises(TraceError, match="must be positive"):
        speed_up_arrivals(tr, 0)


@pytest.mark.parametrize("factor", [math.nan, math.inf])
def test_speed_up_arrivals_refuses_nan_and_inf(factor: float) -> None:
    """`--arrival-speedup nan` made every submit time nan: the replay never reached them and ran
    for ever (inf put every job at time 0). Refused with the option's value instead."""
    from corral.sim.trace import Trace, speed_up_arrivals

    tr = Trace("t", (TraceJob("a", 0, 5, 1, "g"), TraceJob("b", 100, 5, 1, "g")))
    with pytest.raises(TraceError, match="must be positive and finite"):
        speed_up_arrivals(tr, factor)


def test_duplicate_job_id_names_both_lines(tmp_path: Path) -> None:
    path = write(tmp_path, "job_id,submit_time,duration,num_gpus,group\na,0,1,1,g\nb,1,1,1,g\na,2,1,1,g\n")
    expected = r"t.csv: line 4: column 'job_id': 'a' is already the job_id of line 2"
    with pytest.raises(TraceError, match=expected):
        load_generic_csv(path)


def test_a_header_with_a_byte_order_mark_or_a_column_twice(tmp_path: Path) -> None:
    """A CSV saved by a spreadsheet starts with a byte-order mark: it was read as part of the first
    column's name ('missing required column(s) submit_time' while the header has it). A column
    named twice took the row's later value without a word."""
    bom = tmp_path / "bom.csv"
    bom.write_bytes(b"\xef\xbb\xbfsubmit_time,duration,num_gpus,group\n0,10,1,g\n")
    assert [j.num_gpus for j in load_generic_csv(bom).jobs] == [1]
    twice = tmp_path / "twice.csv"
    twice.write_text("submit_time,duration,num_gpus,group,num_gpus\n0,10,1,g,2\n")
    with pytest.raises(TraceError, match=r"twice.csv: line 1: column\(s\) num_gpus appear more than once"):
        load_generic_csv(twice)


def test_a_column_the_format_does_not_have_is_named_in_the_notes(tmp_path: Path) -> None:
    """A misspelt optional column (`gpu_modle`) was dropped without a word: the jobs replayed with no
    GPU-model constraint. It is named in the trace's notes (printed with the run); sim-export's
    observed columns are known, and a trace of the format's own columns has no such note."""
    path = tmp_path / "t.csv"
    path.write_text("submit_time,duration,num_gpus,group,gpu_modle,wait_s\n0,10,1,g,A100,3\n")
    (note,) = load_generic_csv(path).notes
    assert note.startswith("column(s) not read: gpu_modle (the format's optional columns: job_id,"), note
    path.write_text("submit_time,duration,num_gpus,group,gpu_model\n0,10,1,g,A100\n")
    assert load_generic_csv(path).notes == ()


def test_a_default_job_id_taken_by_another_row_says_it_was_not_given(tmp_path: Path) -> None:
    """Row 2 has no job_id, so it is `job-1` (its row index), which row 1 named itself: the error
    said 'job-1' is already the job_id of line 2, on a line whose job_id column is empty."""
    path = write(tmp_path, "job_id,submit_time,duration,num_gpus,group\njob-1,0,1,1,g\n,1,1,1,g\n")
    expected = (
        r"t.csv: line 3: column 'job_id': no job_id given, and its default 'job-1' is already "
        r"the job_id of line 2"
    )
    with pytest.raises(TraceError, match=expected):
        load_generic_csv(path)
