"""module_utils/drain.py: the requests in flight, from real vLLM /metrics pages (CPU build 0.32.0) and from the
shapes a drain meets (several engines, a server still starting, one that is not vLLM)."""

import os

import pytest

from ansible_collections.sparkfleet.cluster.plugins.module_utils.drain import in_flight
from ansible_collections.sparkfleet.cluster.plugins.module_utils.prometheus_text import MetricsParseError

DATA = os.path.join(os.path.dirname(__file__), "data", "vllm")


@pytest.mark.parametrize("name", ["cpu-0.32.0-llama.metrics", "cpu-0.32.0-mla.metrics"])
def test_an_idle_server_has_nothing_in_flight(name):
    with open(os.path.join(DATA, name), encoding="utf-8") as handle:
        assert in_flight(handle.read()) == {"running": 0, "waiting": 0}


def busy(running, waiting):
    with open(os.path.join(DATA, "cpu-0.32.0-llama.metrics"), encoding="utf-8") as handle:
        text = handle.read()
    return (text.replace('vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                         f'vllm:num_requests_running{{engine="0",model_name="tiny"}} {running}')
            .replace('vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
                     f'vllm:num_requests_waiting{{engine="0",model_name="tiny"}} {waiting}'))


def test_the_running_and_waiting_requests_are_counted_apart():
    assert in_flight(busy("3.0", "2.0")) == {"running": 3, "waiting": 2}


def test_every_engine_counts():
    text = ('vllm:num_requests_running{engine="0",model_name="m"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            'vllm:num_requests_waiting{engine="1",model_name="m"} 4.0\n')
    assert in_flight(text) == {"running": 3, "waiting": 4}


def test_a_page_without_vllms_gauges_says_nothing_rather_than_zero():
    assert in_flight("# HELP up whatever\nprocess_cpu_seconds_total 1.5\n") is None
    assert in_flight("") is None


def test_a_page_that_is_not_the_text_format_is_an_error_not_a_count():
    with pytest.raises(MetricsParseError):
        in_flight('vllm:num_requests_running{engine="0" 1\n')
