"""The chart files are real SVG and PNG, with a point per measured level."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree

import pytest
from PIL import Image

from modelpool.loadgen import LevelRun, RequestRecord, summarize
from modelpool.loadgen.chart import ChartError, write_chart

SVG = "{http://www.w3.org/2000/svg}"


def runs(levels=(1, 4, 16)):
    out = []
    for n in levels:
        records = [
            RequestRecord(i, n, latency_s=1.0, ttft_s=0.1 * n, output_tokens=10, tokens_from_usage=True)
            for i in range(n)
        ]
        out.append(LevelRun(summarize(records, n, wall_s=1.0), records))
    return out


def test_svg_is_well_formed_with_a_point_per_level(tmp_path):
    path = tmp_path / "c.svg"
    write_chart(path, "chat · <model> & co", "chat", runs())
    root = ElementTree.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    assert len(root.findall(f"{SVG}circle")) == 2 * 3  # two panels, three levels
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "chat · <model> & co" in texts and "output tokens/s" in texts and "16" in texts


def test_png_is_a_png(tmp_path):
    path = tmp_path / "c.png"
    write_chart(path, "embeddings", "embeddings", runs((1, 8)))
    with Image.open(path) as image:
        assert image.format == "PNG" and image.size == (960, 400)


def test_a_level_with_no_success_has_no_first_byte_point(tmp_path):
    failed = RequestRecord(0, 2).fail("timeout", "slow")
    level = LevelRun(summarize([failed], 2, 1.0), [failed])
    assert math.isnan(level.summary.ttft.p50)
    path = tmp_path / "c.svg"
    write_chart(path, "t", "speech", [*runs((1,)), level])
    # requests/s: both levels (0 is a measure); time to first byte: only the level that had one
    assert len(ElementTree.parse(path).getroot().findall(f"{SVG}circle")) == 3


def test_other_suffixes_are_refused(tmp_path):
    with pytest.raises(ChartError, match="chart"):
        write_chart(tmp_path / "c.jpg", "t", "chat", runs())
