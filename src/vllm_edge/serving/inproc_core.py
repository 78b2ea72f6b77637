"""vLLM's async server with its engine core in the server's own process.

vLLM 0.32's AsyncLLM always starts its engine core in a process of its own (its client factory
refuses asyncio without multiprocessing). For one small model on a small machine, that second
process carries a second copy of torch, vLLM and the tokenizer, and the API server process that
holds the first copy only does HTTP and tokenization (``bench server`` measures both layouts).

:func:`install` hands AsyncLLM a client whose core is vLLM's own ``EngineCore``, built and
stepped on one engine thread of the server process. Everything vLLM's server does (routes,
tool parsers, structured output, the request gate) is unchanged; only the hop between the API
server and the engine core is gone. The event loop stays free for HTTP while a step runs: the
forward spends its time in kernels that release the GIL.

One thread does all of the engine's work (load, steps, adds, aborts) because torch's OpenMP
pool, and vLLM's binding of its threads to cores, belong to the thread that made them; and so
that an abort lands between two steps, never inside one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import queue
import threading
from types import SimpleNamespace
from typing import Any, Callable

THREAD_NAME = "vllm-edge-engine"
# InprocClient's blocking calls that AsyncLLM (and the server's admin routes) reach through
# their ``*_async`` twins; each runs on the engine thread, between steps.
FORWARDED = ("get_supported_tasks", "reset_mm_cache", "reset_prefix_cache", "reset_encoder_cache",
             "sleep", "wake_up", "is_sleeping", "release_kv_cache_memory", "add_lora",
             "remove_lora", "list_loras", "pin_lora", "collective_rpc", "profile",
             "execute_dummy_batch", "set_weight_version", "get_weight_version",
             "save_sharded_state")


class EngineThread:
    """One daemon thread that runs calls in order. Daemon: a SIGTERM during a long load ends
    the process instead of waiting for the load (a ThreadPoolExecutor's workers are joined at
    exit)."""

    def __init__(self) -> None:
        self._calls: queue.Queue = queue.Queue()
        self.stopped = False
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # handed to the caller, which decides
                fut.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        if self.stopped:  # nobody would ever run it: fail now rather than wait forever
            raise RuntimeError("the engine thread has stopped")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((fn, fut))
        return fut

    def call(self, fn: Callable[[], Any]) -> Any:
        """From a thread that may block (the constructor, shutdown)."""
        return self.submit(fn).result()

    async def run(self, fn: Callable[[], Any]) -> Any:
        """From the event loop: awaits the call without blocking the loop."""
        return await asyncio.wrap_future(self.submit(fn))

    async def run_even_if_cancelled(self, fn: Callable[[], Any]) -> Any:
        """As :meth:`run`, for a call that must happen although its caller is being cancelled.
        The call is queued before the first await, and a cancelled wait leaves it queued (a
        cancelled :meth:`run` cancels its queued call)."""
        return await asyncio.shield(asyncio.wrap_future(self.submit(fn)))

    def stop(self) -> None:
        self.stopped = True
        self._calls.put(None)


def client_class() -> type:
    """The in-process async client, as a subclass of vLLM's InprocClient (imported late: vLLM
    is heavy, and this module is imported by the serve plan)."""
    from vllm.v1.engine.core_client import InprocClient

    class InprocAsyncClient(InprocClient):
        """InprocClient's core behind AsyncLLM's async client interface."""

        def __init__(self, vllm_config: Any, executor_class: type, log_stats: bool) -> None:
            self._engine = EngineThread()
            self._work: asyncio.Event | None = None
            # what AsyncLLM and the server read of an AsyncMPClient
            self.engine_ranks_managed = [0]
            self.resources = SimpleNamespace(engine_dead=False)
            try:
                self._engine.call(functools.partial(InprocClient.__init__, self, vllm_config,
                                                    executor_class, log_stats))
            except BaseException:
                self._engine.stop()
                raise

        def _has_work(self) -> asyncio.Event:
            if self._work is None:  # made in the loop that waits on it
                self._work = asyncio.Event()
            return self._work

        async def get_output_async(self) -> Any:
            # AsyncLLM's output handler calls this in a loop: with nothing scheduled it waits
            # for a request instead of spinning through empty steps. The check and the clear
            # run on the loop with no await between them, and a request is added before its
            # set(), so no request waits unseen.
            work = self._has_work()
            while not self.engine_core.scheduler.has_requests():
                work.clear()
                await work.wait()
            try:
                return await self._engine.run(self.get_output)
            except Exception:  # not CancelledError: AsyncLLM cancels this wait when it shuts down
                self.resources.engine_dead = True  # /health answers 500 from now on
                raise

        async def add_request_async(self, request: Any) -> None:
            await self._engine.run(functools.partial(self.add_request, request))
            self._has_work().set()

        async def abort_requests_async(self, request_ids: list[str]) -> None:
            # AsyncLLM aborts from the task of a request whose client hung up, and Starlette's
            # cancel scope cancels that task again at each of its awaits. A plain run() would
            # have its queued abort cancelled while a step runs, and the engine would decode
            # the request to its last token for nobody.
            await self._engine.run_even_if_cancelled(
                functools.partial(self.abort_requests, request_ids))

        def shutdown(self, timeout: float | None = None) -> None:
            engine = getattr(self, "_engine", None)
            if engine is None or engine.stopped:  # AsyncLLM shuts down twice on the way out
                return
            try:
                engine.call(functools.partial(InprocClient.shutdown, self, timeout))
            finally:
                engine.stop()

    def forward(name: str) -> Callable[..., Any]:
        async def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await self._engine.run(functools.partial(getattr(self, name), *args, **kwargs))

        call.__name__ = name + "_async"
        return call

    for name in FORWARDED:
        setattr(InprocAsyncClient, name + "_async", forward(name))
    return InprocAsyncClient


def install(on_ready: Callable[[], None] | None = None) -> None:
    """From now on, this process's AsyncLLM runs its engine core in this process. Only for a
    process that serves one engine (the keep-alive server): the switch is process-wide.
    ``on_ready`` is called once the engine core is built (loaded, warmed up, KV allocated)."""
    from vllm.v1.engine.core_client import EngineCoreClient

    cls = client_class()

    def make_client(vllm_config: Any, executor_class: type, log_stats: bool,
                    client_addresses: dict[str, Any] | None = None, client_count: int = 1,
                    client_index: int = 0, renderer: Any = None) -> Any:
        if client_addresses or client_count != 1 or vllm_config.parallel_config.data_parallel_size > 1:
            raise ValueError("an engine core in the server's process serves one API server "
                             "and one data-parallel rank")
        client = cls(vllm_config, executor_class, log_stats)
        if on_ready is not None:
            on_ready()
        return client

    EngineCoreClient.make_async_mp_client = staticmethod(make_client)
