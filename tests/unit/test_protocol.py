"""Messages: round trips, and a readable answer for every kind of bad line."""

from __future__ import annotations

import msgspec
import pytest

from bsmon.probes.wire import protocol
from bsmon.probes.wire.protocol import ProtocolError


def test_every_server_message_round_trips():
    session = protocol.SessionInfo(
        name="j",
        pid=1,
        host="h",
        argv=["x"],
        start_time=1.0,
        python="3.11",
        torch_version="2",
        bsmon_version="0",
    )
    messages = [
        protocol.Hello(
            protocol=1,
            session=session,
            step=3,
            batch_size=8,
            capabilities={},
            gpu=protocol.Capability(False, "why"),
            noise_scale=protocol.Capability(True),
        ),
        protocol.History(
            points=[protocol.MetricsPoint(t=1.0, step=2, steps=2, scalars={"loss": 1.5})]
        ),
        protocol.Metrics(
            t=2.0,
            step=3,
            batch_size=8,
            step_time_s=0.1,
            samples_per_s=80.0,
            b_simple=None,
            devices=[protocol.DeviceReading(index=0, util_percent=50.0)],
        ),
        protocol.Event(t=1.0, step=1, kind="k", message="m", level="warning"),
        protocol.Reply(id="a", ok=False, error="no"),
        protocol.Notice(message="n", closing=True),
        protocol.Bye(reason="closed", t=5.0),
    ]
    for message in messages:
        line = protocol.encode(message)
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        assert protocol.decode_server_message(line) == message


def test_metrics_carry_the_fields_outside_tests_rely_on():
    metrics = protocol.Metrics(
        t=1.0, step=1, batch_size=4, step_time_s=None, samples_per_s=None, b_simple=None
    )
    data = msgspec.json.decode(protocol.encode(metrics))
    for field in (
        "type",
        "step",
        "batch_size",
        "step_time_s",
        "samples_per_s",
        "b_simple",
        "devices",
    ):
        assert field in data
    assert data["type"] == "metrics" and data["b_simple"] is None


def test_unknown_server_message_type_is_ignored_by_clients():
    assert protocol.decode_server_message(b'{"type": "from_the_future", "x": 1}') is None


@pytest.mark.parametrize(
    ("line", "expected", "command_id"),
    [
        (b"not json", "not valid JSON", None),
        (b"[1, 2]", "must be a JSON object, got an array", None),
        (b'"ping"', "must be a JSON object, got a string", None),
        (b'{"id": 3}', "missing field `type`", 3),
        (
            b'{"type": "explode", "id": "x"}',
            "unknown command type 'explode'; known: autopilot, ping, probe",
            "x",
        ),
        (b'{"type": 5, "id": 1}', "`type` must be a string, got an integer", 1),
        (b'{"type": ["ping"], "id": 1}', "`type` must be a string, got an array", 1),
        (b'{"type": "set_batch_size", "id": 1}', "set_batch_size: missing field `value`", 1),
        (
            b'{"type": "set_batch_size", "id": 2, "value": "64"}',
            "set_batch_size: `value` must be an integer, got a string",
            2,
        ),
        (b'{"type": "set_batch_size", "id": 3, "value": 0}', "`value` must be at least 1", 3),
        (b'{"type": "set_batch_size", "id": 4, "value": -5}', "`value` must be at least 1", 4),
        (
            b'{"type": "set_batch_size", "id": 4, "value": 1180591620717411303424}',
            "`value` must be at most 2147483648",
            4,
        ),
        (
            b'{"type": "set_batch_size", "id": 5, "value": 2.5}',
            "must be an integer, got a number",
            5,
        ),
        (
            b'{"type": "set_batch_size", "id": 6, "value": true}',
            "must be an integer, got a boolean",
            6,
        ),
        (
            b'{"type": "step_batch_size", "id": 7, "direction": "sideways"}',
            "`direction` must be one of 'up', 'down', got 'sideways'",
            7,
        ),
        (b'{"type": "step_batch_size", "id": 8}', "missing field `direction`", 8),
        (
            b'{"type": "set_batch_size", "id": 9, "value": 8, "reason": "%s"}' % (b"r" * 201),
            "set_batch_size: `reason` must be at most 200 characters long",
            9,
        ),
        (
            b'{"type": "ping", "id": "%s"}' % (b"i" * 201),
            "`id` must be at most 200 characters",
            None,
        ),
        (b'{"type": "ping", "id": [1]}', "`id` must be an integer or a string", None),
        (b'{"type": "ping", "id": false}', "`id` must be an integer or a string", None),
        (b"\xff\xfe\x00", "not valid JSON", None),
        (b'{"type": "ping", "id": "\xff"}', "not valid JSON: not UTF-8", None),
        (b"[" * 100_000, "not valid JSON: nested too deeply", None),
    ],
)
def test_bad_commands_get_a_readable_reason(line, expected, command_id):
    with pytest.raises(ProtocolError) as info:
        protocol.decode_command(line)
    assert expected in str(info.value)
    assert info.value.command_id == command_id


def test_an_unknown_type_is_echoed_short_not_whole():
    with pytest.raises(ProtocolError) as info:
        protocol.decode_command(b'{"type": "%s"}' % (b"x" * 100_000))
    assert len(str(info.value)) < 200 and "xxx…'" in str(info.value)


def test_a_refused_value_is_echoed_short_not_whole():
    line = b'{"type": "step_batch_size", "id": 1, "direction": "%s"}' % (b"x" * 100_000)
    with pytest.raises(ProtocolError) as info:
        protocol.decode_command(line)
    assert len(str(info.value)) < 200 and "got 'xxx" in str(info.value)


def test_free_text_up_to_its_limit_is_a_command():
    at_limit = "r" * protocol.MAX_TEXT_CHARS
    line = protocol.encode(protocol.SetBatchSize(id=at_limit, value=8, reason=at_limit))
    assert protocol.decode_command(line) == protocol.SetBatchSize(
        id=at_limit, value=8, reason=at_limit
    )


def test_a_server_line_with_a_type_that_is_not_a_string_is_not_a_message():
    assert protocol.decode_server_message(b'{"type": ["hello"]}') is None


def test_good_commands_decode_to_their_types():
    assert protocol.decode_command(b'{"type":"ping","id":1}') == protocol.Ping(id=1)
    command = protocol.decode_command(b'{"type":"set_batch_size","id":"a","value":128}')
    assert command == protocol.SetBatchSize(id="a", value=128)
    command = protocol.decode_command(b'{"type":"step_batch_size","direction":"down"}')
    assert isinstance(command, protocol.StepBatchSize) and command.direction == "down"
    assert command.id is None


def test_unknown_extra_fields_in_a_command_are_tolerated():
    command = protocol.decode_command(b'{"type":"ping","id":9,"future_field":true}')
    assert command == protocol.Ping(id=9)


def test_protocol_doc_describes_every_message_and_field():
    from ..helpers import ROOT

    doc = (ROOT / "docs" / "protocol.md").read_text()
    for kind in protocol.SERVER_MESSAGES:
        assert f"### `{kind}`" in doc, f"docs/protocol.md lacks a section for {kind}"
    for field in msgspec.structs.fields(protocol.Metrics):
        assert f"`{field.name}`" in doc, f"docs/protocol.md does not mention metrics.{field.name}"
    for kind, cls in protocol.CLIENT_COMMANDS.items():
        assert f"| `{kind}` |" in doc
        for field in msgspec.structs.fields(cls):
            assert f"`{field.name}`" in doc, (
                f"docs/protocol.md does not mention {kind}.{field.name}"
            )


def test_a_change_s_throughput_verdict_is_one_of_the_words_the_doc_lists():
    from typing import get_args

    from bsmon.probes.batch import verdict

    from ..helpers import ROOT

    words = set(get_args(protocol.ThroughputVerdict))
    assert words == {verdict.FASTER, verdict.SLOWER, verdict.SAME, verdict.LEFT, verdict.UNCOMPARED}
    doc = (ROOT / "docs" / "protocol.md").read_text()
    assert all(f"`{word}`" in doc for word in words)
    change = protocol.BatchChange(1, 0.0, 8, 16, reason="", source="keys", verdict="faster")
    assert b'"verdict":"faster"' in msgspec.json.encode(change)  # on the wire as before
