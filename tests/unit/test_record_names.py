"""Record file names: the job's name, cut in its middle when long, so a rank's suffix stays."""

from __future__ import annotations

from pathlib import Path

from bsmon.probes.record.writer import NAME_CHARS, default_record_path


def test_a_long_name_keeps_its_rank_suffix():
    name = "train_imagenet_resnet18_with_a_long_descriptive_name-rank1"
    path = default_record_path(Path("/r"), name, 0.0, 42)
    stem = path.name.removesuffix("-42.jsonl").split("-", 2)[2]  # after the date and time
    assert stem.endswith("-rank1") and len(stem) == NAME_CHARS
    assert stem.startswith("train_imagenet_resnet18")


def test_short_names_and_names_without_a_rank_are_kept_or_cut_at_the_end():
    assert default_record_path(Path("/r"), "fit-rank3", 0.0, 7).name.endswith("-fit-rank3-7.jsonl")
    long = default_record_path(Path("/r"), "x" * 60, 0.0, 7).name
    assert long.endswith("-" + "x" * NAME_CHARS + "-7.jsonl")
