"""The server-rendered SVG charts: deterministic, escaped, spikes flagged."""

from __future__ import annotations

import re

from dashboard.charts import HEIGHT, nice_ceiling, peaks, series_chart


def _chart(values, **kw):
    return series_chart(values, title=kw.pop("title", "Retries"), value="1/s", x_labels=("a", "now"), **kw)


def test_the_same_numbers_give_the_same_bytes():
    values = [0, 1, 5, 2, None, 3]
    assert str(_chart(values).svg) == str(_chart(list(values)).svg)
    assert str(_chart(values).svg) != str(_chart([0, 1, 5, 2, None, 4]).svg)


def test_titles_are_escaped_inside_the_svg():
    svg = str(_chart([1, 2], title='<script>alert("x")</script> & co').svg)
    assert "<script>" not in svg
    assert "<title>&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; co</title>" in svg


def test_the_scale_is_a_round_number_above_the_highest_value():
    assert [nice_ceiling(v) for v in (0, 0.3, 1, 1.1, 3, 7, 12, 480, 501)] == [1, 1, 1, 2, 5, 10, 20, 500, 1000]
    assert _chart([3, 7, 2]).y_max == "10"
    assert _chart([0, 0], minimum_max=10).y_max == "10"


def test_the_highest_value_reaches_the_top_and_zero_the_bottom():
    d = re.search(r'<path class="area" d="([^"]+)"', str(_chart([0, 10]).svg))[1]
    ys = [float(v) for v in re.findall(r"V([\d.]+)", d)]
    assert HEIGHT in ys and min(ys) == 4.0  # TOP_PAD above the highest step


def test_missing_samples_break_the_area_into_pieces():
    d = re.search(r'<path class="area" d="([^"]+)"', str(_chart([1, 2, None, None, 3]).svg))[1]
    assert d.count("M") == 2 and d.count("Z") == 2


def test_a_spike_is_drawn_apart_and_explained():
    calm = _chart([1] * 20, highlight_last=5)
    assert "spike" not in str(calm.svg) and not calm.spike
    hot = _chart([1] * 15 + [30] * 5, highlight_last=5, spike=True, note="Spike: 30/s")
    svg = str(hot.svg)
    assert 'class="spike-band"' in svg and 'class="area spike"' in svg
    assert hot.spike and hot.note == "Spike: 30/s"


def test_peaks_keep_every_bins_highest_value():
    values = [0] * 100
    values[37] = 9
    assert max(peaks(values, 10)) == 9 and len(peaks(values, 10)) == 10
    assert peaks([1, 2, 3], 10) == [1, 2, 3]
