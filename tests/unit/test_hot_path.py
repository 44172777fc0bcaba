"""What bsmon costs the training thread, pinned: the Python calls it adds to an ordinary step
(one the noise scale does not measure and the anatomy does not sample), counted with cProfile
on the training thread the way ``benchmarks/hostcost.py`` counts them. Counts, not times: they
do not depend on the machine's load."""

from __future__ import annotations

import itertools
import weakref

import pytest
import torch
from torch import nn

from bsmon.probes import attach
from bsmon.probes.runtime.logged import SAMPLE_ABOVE
from bsmon.probes.runtime.samples import CHECK_EVERY, NOT_COUNTED, STEADY_AFTER, StepTally

from ..gpu_check_kit import BENCHMARKS  # noqa: F401  (puts benchmarks/ on the import path)

# the logging call the loop makes is a lambda of the benchmark's: one call of its own
LOG_CALL = 1


@pytest.fixture(scope="module")
def counting():
    from hostcost_kit import counting

    return counting


@pytest.fixture(scope="module")
def setups():
    from hostcost_kit import setups

    return setups


@pytest.mark.parametrize(
    ("config", "most", "own"),
    [
        # post-hook + perf_counter; log, which is a dict.update on a fast loop
        ("telemetry (noise, anatomy, record off)", 3, 1),
        ("defaults (noise scale on its budget)", 3, 1),
        ("defaults, no batch size declared", 3, 1),
        # post-hook + perf_counter; backward()'s wrapper + append (no log call)
        ("bsmon run (zero-code)", 4, 2),
    ],
)
def test_an_ordinary_step_costs_a_handful_of_calls(counting, setups, config, most, own):
    count = counting.count_calls(setups.CONFIGS[config], "tiny", steps=200, warmup=120)
    added = count.ordinary - (LOG_CALL if "zero-code" not in config else 0)
    assert added <= most, count
    assert count.bsmon <= own, count  # the post-hook, and the backward wrapper


def test_a_measured_step_costs_its_hooks_and_one_pass_of_the_slow_path(counting, setups):
    """noise_budget=None measures every step: each is a step of the scheduled slow path
    (agent/boundary.py), which asks only the parts that still have work there. The per-example
    norms' own calls (bsmon +108, of which the hooks' C and torch calls follow) were 223 in
    all before the slow path was split into parts, 231 after, and 223 again once a part done
    for good stopped being asked (issue 44); 203 (bsmon 97) once a 2-D linear layer's norms
    took one op in each hook, the layers' products one sum at the end of the pass, and the
    hooks were pre-hooks of the outputs' nodes (issue 40)."""
    count = counting.count_calls(setups.CONFIGS["noise scale every step"], "tiny", steps=200)
    assert count.ordinary <= 203, count
    assert count.bsmon <= 97, count


def test_resizable_costs_what_bsmon_run_costs_until_a_key_is_pressed(counting, setups):
    """--resizable on a DataLoader loop: batch control over the script's loader adds no
    call to any step (it acts only at a change, and once per epoch)."""
    plain, resizable = (
        counting.count_calls(setups.CONFIGS[name], "tiny-loader", steps=200, warmup=120)
        for name in ("bsmon run (zero-code)", "bsmon run --resizable")
    )
    assert resizable.ordinary == plain.ordinary and resizable.bsmon == plain.bsmon, (
        plain,
        resizable,
    )


def test_a_batchnorm_model_waiting_for_accumulation_costs_its_ordinary_steps_nothing(
    counting, setups
):
    """auto does not measure a BatchNorm model per example; it looks at one step in 64 for
    gradient accumulation, and the others cost what any ordinary step costs."""
    # the step anatomy off in both: how many steps it samples in the 320 depends on how many
    # the warm-up ran (it runs two ticks of wall time), and it is not what is compared here
    on = setups.bsmon(**setups.DECLARED, record=True, step_anatomy=False)
    count = counting.count_calls(on, "tiny-bn", steps=320, warmup=20)
    assert count.ordinary - LOG_CALL <= 5, count
    off = setups.bsmon(**setups.DECLARED, record=True, step_anatomy=False, noise_scale=None)
    without = counting.count_calls(off, "tiny-bn", steps=320, warmup=20)
    assert count.mean - without.mean < 3, (count, without)  # ~100 calls every 64 steps


def test_telemetry_alone_costs_the_same_on_every_step(counting, setups):
    config = setups.CONFIGS["telemetry (noise, anatomy, record off)"]
    # after the start: the logging mode times steps 1 to 1 + SAMPLE_ABOVE at two boundaries
    count = counting.count_calls(config, "tiny", steps=200, warmup=SAMPLE_ABOVE + 20)
    # nothing is sampled or measured: the only steps that do more are those that drop the
    # losses a tick handed back (the full path's two calls). How many of the 200 do depends
    # on how many ticks their wall time held, which cProfile and the machine's load stretch
    # (a loaded run: 4.38 calls on average), so it is each step's cost that is pinned
    assert count.ordinary == 3 + LOG_CALL and count.bsmon == 1, count
    assert count.most - count.ordinary <= 2, count


def test_the_floor_is_what_the_benchmark_says(counting, setups):
    count = counting.count_calls(setups.CONFIGS["floor: perf_counter + append in a post-hook"])
    assert count.ordinary == 3 and count.by_category == {"C": 2, "other": 1}


def test_sampled_and_measured_steps_stay_a_minority_of_the_cost(counting, setups):
    count = counting.count_calls(
        setups.CONFIGS["defaults (noise scale on its budget)"], "tiny", steps=400, warmup=800
    )
    assert count.mean < 8 * count.ordinary, count  # was 99 calls on every step


# -- the model's examples, counted on every step only until they are steady ------------------


def test_a_steady_count_is_then_only_checked_and_a_change_counts_every_step_again():
    tally = StepTally()
    for _ in range(STEADY_AFTER):
        assert tally.resolve(0, 0, 12, 0) == (12, 12)
    assert tally.steady == 12
    assert [s for s in range(1, 49) if tally.counts_model_examples(s)] == [16, 32, 48]
    assert tally.resolve(0, 0, NOT_COUNTED, 0)[0] == 12  # a step between checks
    assert tally.resolve(0, 0, 7, 0)[0] == 7  # a check that differs
    assert tally.steady is None and tally.varies
    assert all(tally.counts_model_examples(s) for s in range(1, 40))
    for _ in range(STEADY_AFTER + 5):
        tally.resolve(0, 0, 7, 0)
    assert tally.steady is None  # once varied, counted for good


def test_the_checks_of_a_steady_count_come_a_quarter_second_apart_on_a_fast_loop():
    tally = StepTally()
    for _ in range(STEADY_AFTER):
        tally.resolve(0, 0, 12, 0)
    tally.follow_rate(1500, 0.25)  # a 167 µs step: a check every 2,048 steps (0.34 s)
    assert tally.check_every == 2048
    assert [s for s in range(1, 4097) if tally.counts_model_examples(s)] == [2048, 4096]
    tally.follow_rate(5, 0.25)  # a 50 ms step: every CHECK_EVERY steps, as before
    assert tally.check_every == CHECK_EVERY
    tally.follow_rate(0, 0.25)  # a tick without two step ends says nothing of the rate
    assert tally.check_every == CHECK_EVERY
    tally.resolve(0, 0, 7, 0)  # a check that differs: every step is counted again
    assert all(tally.counts_model_examples(s) for s in range(1, 40))


def test_the_job_s_own_batches_stop_the_count():
    tally = StepTally()
    tally.resolve(8, 8, 0, 0)
    assert not any(tally.counts_model_examples(s) for s in range(1, 40))


def test_a_job_without_a_dataloader_counts_its_samples_and_drops_the_forward_hook():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    held = []
    steps = STEADY_AFTER + 4 * CHECK_EVERY
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        for step in range(1, steps + 1):
            held.append(mon._model_examples.wanted)
            model(torch.randn(6, 4)).sum().backward()
            optimizer.step()
            if step % 8 == 0:
                assert mon.flush()  # the agent thread keeps pace, as it does in a real job
        assert mon.flush()
        assert mon.job.telemetry.samples == 6 * (steps - 1)  # the first step has no count
        assert mon.job.telemetry.batch_size == 6
    # once steady, the hook is held only on the checks: steps on multiples of CHECK_EVERY (a
    # fast loop like this one spaces them further: a quarter second, test above)
    late = list(enumerate(held, start=1))[-2 * CHECK_EVERY :]
    checked = [step for step, wanted in late if wanted]
    assert len(checked) <= 2 and all(step % CHECK_EVERY == 0 for step in checked), checked


def test_evaluation_without_a_dataloader_stays_out_of_the_step_time_once_the_count_is_steady():
    """nanoGPT's estimate_loss: model.eval(), passes under no_grad, model.train() — seen by
    the train()/eval() switches although the forward watch is no longer held."""
    import time

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    evaluated = 0.0
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        for step in range(1, 121):
            model(torch.randn(6, 4)).sum().backward()
            optimizer.step()
            if step % 8 == 0:
                assert mon.flush()
            if step in (60, 90):  # well after the count became steady
                began = time.perf_counter()
                model.eval()
                with torch.no_grad():
                    while time.perf_counter() - began < 0.05:
                        model(torch.randn(6, 4))
                model.train()
                evaluated += time.perf_counter() - began
        assert not mon._model_examples.wanted or mon.job.telemetry.tally.steady is None
        assert mon.flush()
        eval_s = mon.job.telemetry.eval_s
    assert abs(eval_s - evaluated) <= 0.01, (eval_s, evaluated)


def test_a_loader_that_fetches_ahead_is_counted_once_and_raises_no_warning():
    """The last step of an epoch draws no batch (the loader drew it a step early): its
    samples were counted where they were drawn, and nothing says they were not counted."""
    from torch.utils.data import DataLoader, TensorDataset

    def ahead(loader):
        batches = iter(loader)
        following = next(batches, None)
        while following is not None:
            current, following = following, next(batches, None)
            yield current

    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(torch.randn(96, 4)), batch_size=16)  # 6 steps an epoch
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        for _ in range(3):
            for (x,) in ahead(loader):
                model(x).sum().backward()
                optimizer.step()
        assert mon.flush()
        assert mon.job.telemetry.samples == 3 * 96
        assert mon.job.telemetry.samples_note is None
        assert not [e for e in mon.job.telemetry.events if e.kind == "samples_not_counted"]


def test_a_tokenizer_s_batch_encoding_is_counted_from_the_dataloader():
    """Hugging Face's BatchEncoding (tokenizer.pad, DataCollatorWithPadding) is a UserDict, not
    a dict: its first tensor still says the samples, from the first step on."""
    from collections import UserDict

    from torch.utils.data import DataLoader

    def collate(rows):
        return UserDict({"input_ids": torch.stack(rows), "attention_mask": torch.stack(rows)})

    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(list(torch.randn(40, 4)), batch_size=8, collate_fn=collate)
    with attach(model, optimizer, serve=False, record=False, noise_scale=None) as mon:
        for batch in loader:
            model(batch["input_ids"]).sum().backward()
            optimizer.step()
        assert mon.flush()
        assert mon.job.telemetry.samples == 40 and mon.job.telemetry.batch_size == 8


def test_the_job_s_tensors_handed_back_are_let_go_of_a_few_each_step():
    """The agent's tick hands back a tick's tensors at once; the training thread drops them
    over the next steps, as fast as they came and never all in one step (a bulk free defeats
    the allocator's per-thread cache, and each freed graph is cold), and none is left over."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with attach(model, optimizer, batch_size=2, serve=False, record=False) as mon:
        hot = mon._hot  # nothing is logged: the agent hands back nothing of its own
        alive = [object() for _ in range(120)]
        hot.hand_back(list(alive), over_steps=40)  # a tick: 120 objects over its 40 steps
        del alive
        left = []
        for _ in range(40):
            optimizer.step()
            left.append(len(hot._handed_back))
    assert left[0] == 120 - 4  # 1 + 120 // 40 a step: the backlog goes before the next tick
    assert all(a > b for a, b in itertools.pairwise(left) if a), left
    assert left[-1] == 0


def test_tensors_read_on_the_last_tick_are_let_go_of_at_close():
    """No step comes after the last tick to drop what it handed back: close() does."""
    model = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = attach(model, optimizer, batch_size=2, serve=False, record=False)
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    optimizer.step()
    mon.log(loss=loss)
    freed = []
    weakref.finalize(loss, lambda: freed.append(True))
    del loss
    mon.close()  # its last tick reads the loss and hands it back
    assert freed == [True]
