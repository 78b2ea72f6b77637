"""The engine thread of the in-process core: every call on one thread, in order, errors back to
the caller, the event loop free while a call runs, and no hold on the process at exit. The
client itself runs on the real engine in test_keepalive_engine.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time

import pytest

from vllm_edge.serving import inproc_core


def test_calls_run_in_order_on_one_thread():
    engine = inproc_core.EngineThread()
    try:
        seen: list[tuple[int, str]] = []
        futures = [engine.submit(lambda i=i: seen.append((i, threading.current_thread().name)))
                   for i in range(50)]
        for f in futures:
            f.result(timeout=10)
        assert [i for i, _ in seen] == list(range(50))
        assert {name for _, name in seen} == {inproc_core.THREAD_NAME}
    finally:
        engine.stop()


def test_an_error_reaches_the_caller_and_the_thread_goes_on():
    engine = inproc_core.EngineThread()
    try:
        with pytest.raises(ZeroDivisionError):
            engine.call(lambda: 1 / 0)
        assert engine.call(lambda: 6 * 7) == 42
    finally:
        engine.stop()


def test_the_loop_runs_while_a_call_blocks():
    engine = inproc_core.EngineThread()

    async def main() -> tuple[int, float]:
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.create_task(tick())
        value = await engine.run(lambda: (time.sleep(0.5), 7)[1])
        ticker.cancel()
        return value, ticks

    try:
        value, ticks = asyncio.run(main())
        assert value == 7 and ticks >= 10  # the loop kept going during the half-second call
    finally:
        engine.stop()


def test_a_call_whose_caller_is_cancelled_while_it_waits_still_runs():
    # as an abort from the task of a request whose client hung up: anyio cancels that task
    # again at every await, and the engine thread is busy with a step
    engine = inproc_core.EngineThread()
    step = threading.Event()
    ran: list[str] = []

    async def main() -> list[str]:
        engine.submit(lambda: step.wait(10))  # the step in progress
        outcomes = []
        for run in (engine.run, engine.run_even_if_cancelled):
            task = asyncio.create_task(run(lambda name=run.__name__: ran.append(name)))
            await asyncio.sleep(0.05)
            for _ in range(3):
                task.cancel()
                await asyncio.sleep(0.01)
            outcomes.append(await asyncio.gather(task, return_exceptions=True))
        step.set()
        await asyncio.wrap_future(engine.submit(lambda: None))  # everything queued before it ran
        return outcomes

    try:
        outcomes = asyncio.run(main())
        assert all(isinstance(o[0], asyncio.CancelledError) for o in outcomes)
        assert ran == ["run_even_if_cancelled"]  # a plain run's call is dropped with its wait
    finally:
        engine.stop()


def test_a_busy_engine_thread_does_not_hold_the_process_at_exit():
    # as a SIGTERM during a long model load: the process ends, not after the load
    code = ("import time; from vllm_edge.serving import inproc_core; "
            "e = inproc_core.EngineThread(); e.submit(lambda: time.sleep(60)); time.sleep(0.2)")
    t = time.time()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert time.time() - t < 30


def test_every_forwarded_call_is_a_method_of_vllms_in_process_client():
    from vllm.v1.engine.core_client import InprocClient

    cls = inproc_core.client_class()
    for name in inproc_core.FORWARDED:
        assert callable(getattr(InprocClient, name)), name
        assert getattr(cls, name + "_async").__name__ == name + "_async"


def test_a_stopped_engine_thread_refuses_calls_instead_of_hanging():
    engine = inproc_core.EngineThread()
    engine.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        engine.call(lambda: 1)
