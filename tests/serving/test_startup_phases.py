"""The phases of a first start, read from a server log as it grows: each phase found by the
line that opens it, its time, and the progress counter of the current one."""

from __future__ import annotations

import io

from vllm_edge.serving.startup_phases import Display, PhaseTracker

LOG = [
    "[vllm-edge] model: /models/smollm2-135m-cpu_int4-g32\n",
    "import SmolLM2-135M-Instruct.Q4_1.gguf:  33%|###       | 1/3 [00:02<00:04, 2.00s/step]\r",
    "quantize cpu_int4 g32:  45%|####      | 123/273 [00:12<00:13, 9.81tensor/s]\r",
    "quantize cpu_int4 g32: 100%|##########| 273/273 [00:30<00:00, 9.10tensor/s]\n",
    "(EngineCore pid=1) INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config\n",
    "(EngineCore pid=1) INFO [cpu_model_runner.py:68] Starting to load model /m...\n",
    "(EngineCore pid=1) INFO [cpu_model_runner.py:87] Warming up model for the compilation...\n",
    "(EngineCore pid=1) INFO [kv_cache_utils.py:2327] CPU KV cache size: 8,320 tokens\n",
    "(MainProcess pid=0) INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:1\n",
]


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_phases_and_progress_as_the_log_grows(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text("")
    clock = Clock()
    tracker = PhaseTracker(log, clock=clock)
    seen = []
    for i, line in enumerate(LOG):
        with open(log, "a") as f:
            f.write(line)
        clock.t = 10.0 * (i + 1)
        seen.append(tracker.poll())
    assert seen[0].current is None  # serve's own lines open no phase
    assert seen[1].current == "converting the model to bf16" and seen[1].progress == "33% 1/3"
    assert seen[2].current == "quantizing" and seen[2].progress == "45% 123/273"
    assert seen[2].ended == [("converting the model to bf16", 10.0)]
    assert seen[3].progress == "100% 273/273"
    assert [u.current for u in seen[4:]] == [
        "starting the engine", "loading the weights", "compiling the model (cached for the next start)",
        "allocating the KV cache", "starting the API server"]
    clock.t += 5
    done = tracker.finish()
    assert done.ended == [("starting the API server", 5.0)] and done.current is None


def test_the_display_keeps_finished_phases_and_redraws_the_current_one(tmp_path):
    log = tmp_path / "serve.log"
    log.write_text(LOG[1] + LOG[2])
    out = io.StringIO()
    show = Display(out, tty=True)
    tracker = PhaseTracker(log)
    show(tracker.poll())
    text = out.getvalue()
    assert "[vllm-edge] converting the model to bf16: " in text and text.endswith(" s")
    assert "\r\033[K[vllm-edge] quantizing... 45% 123/273" in text
    piped = io.StringIO()
    Display(piped, tty=False)(PhaseTracker(log).poll())
    assert "\r" not in piped.getvalue() and "quantizing..." not in piped.getvalue()


def test_an_eager_first_start_is_said_once_on_the_terminal(tmp_path):
    """The server's line that it runs eager while its graph is built reaches the user, once,
    even when it arrives in two reads; the builder's log path stays in the server's log."""
    log = tmp_path / "serve.log"
    line = ("[vllm-edge] compiled graph: not cached yet; this server runs eager, and a process at the "
            "lowest CPU priority builds it for the next start once this engine is ready\n")
    log.write_text(line[:30])
    tracker, out = PhaseTracker(log), io.StringIO()
    show = Display(out, tty=False)
    show(tracker.poll())
    with open(log, "a") as f:
        f.write(line[30:] + "[vllm-edge] compiled graph builder log: /x/graph.log\n" + LOG[4])
    show(tracker.poll())
    show(tracker.finish())
    text = out.getvalue()
    assert text.count("compiled graph: not cached yet") == 1 and "graph.log" not in text


def test_the_native_op_build_opens_its_phase(tmp_path):
    """The line native_op logs when it builds an op (the int4 op, the packed op) is what opens
    the phase, so a first start's tens of seconds of building are on screen, not in "loading"."""
    from vllm_edge.quant.native_op import BUILDING

    log = tmp_path / "serve.log"
    log.write_text(LOG[4] + LOG[5] + "INFO [vllm-edge pid=1] "
                   + BUILDING % "cpu_int8: the packed op (quant/csrc/lowbit_op.cpp)" + "\n")
    clock = Clock()
    tracker = PhaseTracker(log, clock=clock)
    update = tracker.poll()
    assert update.current == "building the native op (once per machine)"
    assert [label for label, _ in update.ended] == ["starting the engine", "loading the weights"]
