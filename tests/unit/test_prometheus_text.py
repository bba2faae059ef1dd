"""module_utils/prometheus_text.py against prometheus_client's own parser, the oracle: the same samples (name,
labels, value) from real vLLM /metrics pages and from the text format's corner cases."""

import math
import os

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.sparkfleet.cluster.plugins.module_utils import prometheus_text as prom

DATA = os.path.join(os.path.dirname(__file__), "data", "vllm")


def oracle(text):
    return [(s.name, dict(s.labels), s.value) for family in text_string_to_metric_families(text)
            for s in family.samples]


def ours(text):
    return [(s.name, s.labels, s.value) for s in prom.parse_prometheus(text)]


def same(left, right):
    assert len(left) == len(right)
    for (name_a, labels_a, value_a), (name_b, labels_b, value_b) in zip(left, right, strict=True):
        assert (name_a, labels_a) == (name_b, labels_b)
        assert value_a == value_b or (math.isnan(value_a) and math.isnan(value_b)), (name_a, value_a, value_b)


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(DATA) if f.endswith(".metrics")))
def test_a_real_vllm_metrics_page_parses_as_prometheus_client_parses_it(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as handle:
        text = handle.read()
    expected = oracle(text)
    assert len(expected) > 10  # a page, not one line
    same(ours(text), expected)


CORNERS = {
    "escapes in label values": 'm{path="C:\\\\dir",quote="say \\"hi\\"",nl="a\\nb"} 1\n',
    "commas and braces inside a value": 'm{a="x,y",b="{z}"} 2\n',
    "an empty label set": "m{} 3\n",
    "a trailing comma": 'm{a="1",} 4\n',
    "special values": "a NaN\nb +Inf\nc -Inf\n",
    "exponents": "a 1e3\nb -2.5E-2\n",
    "a timestamp": "m 7 1700000000000\n",
    "comments and metadata": "# HELP m help text\n# TYPE m gauge\n# just a comment\nm 1\n",
    "a counter and its created sample": "# TYPE c counter\nc_total 5\nc_created 1.7e9\n",
    "a histogram": ('# TYPE h histogram\nh_bucket{le="0.5"} 1\nh_bucket{le="+Inf"} 2\nh_sum 0.7\nh_count 2\n'),
    "blank lines": "\n\na 1\n\n",
    "spaces around labels": 'm{ a = "1" , b="2" } 5\n',
}


@pytest.mark.parametrize("text", CORNERS.values(), ids=CORNERS.keys())
def test_the_text_formats_corner_cases_parse_as_the_oracle_parses_them(text):
    same(ours(text), oracle(text))
