"""Hugging Face transformers baseline behind the Engine protocol: the `generate()` loop a newcomer
writes, so the platform can show what a serving engine adds.

One worker thread owns the model and runs one job at a time (a request, or a static batch): the
baseline has no continuous batching, and the event loop stays free for HTTP. Modes:
  generate      transformers `generate()`; a logits-processor hook picks and streams each token
  no-cache      a step loop that re-feeds the whole sequence every step (cost grows with length)
  kv-cache      the same loop with `past_key_values`: one new token per step
  static-batch  requests arriving within a window are left-padded into one `generate()` call;
                every request in the batch is answered when the longest one ends
Every mode samples with the same per-request code (temperature, top_p, seed, penalties), so a
seeded request gives the same tokens in every mode (serving/engines/hf_rows.py)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    StoppingCriteria,
    StoppingCriteriaList,
)

from serving.config import HFDeploymentConfig, PlatformConfig
from serving.engines.base import (
    Delta,
    EngineStats,
    FinishReason,
    SamplingSpec,
)
from serving.engines.hf_logprobs import prompt_logprobs, token_logprob
from serving.engines.hf_rows import (
    Row,
    choose_token,
    find_stop,
    left_pad,
    row_timings,
    seeded_generator,
    take_delta,
)
from serving.engines.sampling_defaults import model_sampling_defaults

MODES = ("generate", "no-cache", "kv-cache", "static-batch")


def load_dtype(dtype: str, device: str) -> torch.dtype | str:
    if dtype != "auto":
        return getattr(torch, dtype)
    # On CPU, bf16 decode measured ~45% slower than float32 (SmolLM2-135M: 104 vs 71 ms/token on
    # 2 cores), so `auto` means float32 there; on GPU it keeps the checkpoint's dtype.
    return torch.float32 if device == "cpu" else "auto"


class PickAndStream(LogitsProcessor):
    """generate() hook: each unfinished row picks its token with the shared sampler and streams it
    at once; the processor then forces that choice (greedy over a one-hot score). Not a
    BaseStreamer: on CUDA generate() hands streamers each token one step late (deferred stop
    check), and per-row seeds/temperatures need their own sampling anyway."""

    def __init__(self, engine: HFEngine, rows: list[Row]) -> None:
        self.engine = engine
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        chosen = torch.full((len(self.rows),), self.engine.pad_id, dtype=torch.long)
        for i, row in enumerate(self.rows):
            if not row.done:
                chosen[i] = self.engine.step(row, scores[i])
        forced = torch.full_like(scores, -float("inf"))
        # full_like keeps the dtype of the float scores.
        return cast(torch.FloatTensor, forced.scatter_(1, chosen.to(scores.device)[:, None], 0.0))


class RowsDone(StoppingCriteria):
    """Per-row stop flags (finished, cancelled): generate() ends when every row is done."""

    def __init__(self, rows: list[Row]) -> None:
        self.rows = rows

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        done = torch.tensor([row.done for row in self.rows], device=input_ids.device)
        return cast(torch.BoolTensor, done)  # a tensor of Python bools has dtype torch.bool


class HFEngine:
    """A transformers model on one device, served by one worker thread."""

    modes: tuple[str, ...] = MODES
    supports_logprobs = True

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        model_name: str,
        max_model_len: int,
        settings: HFDeploymentConfig,
    ) -> None:
        self.startup_timings: dict[str, float] = {}
        self.sampling_defaults: dict[str, float] = {}
        self.model = model
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self.default_mode = settings.mode
        self.batch_window_s = settings.batch_window_ms / 1000
        self.max_batch_size = settings.max_batch_size
        self.device = next(model.parameters()).device
        self.eos_ids = eos_token_ids(model, tokenizer)
        # The engine decides per row when to stop (ignore_eos, min_tokens): generate() must not.
        model.generation_config.eos_token_id = None
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]
        self.tokens_generated = 0  # every token any request produced (tests watch it stop)
        self._aborted_total = 0
        self._jobs: queue.Queue[Row | None] = queue.Queue()
        self._deferred: deque[Row | None] = deque()  # jobs skipped while a static batch filled up
        self._rows: dict[str, Row] = {}
        self._running = 0
        self._worker = threading.Thread(target=self._work, name="hf-engine", daemon=True)
        self._worker.start()

    @classmethod
    def load(cls, config: PlatformConfig, model_dir: Path) -> HFEngine:
        device = "cuda" if config.hf.resources.accelerator == "gpu" else "cpu"
        model = (
            AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=load_dtype(config.model.dtype, device)
            )
            .to(device)  # type: ignore[arg-type]  # .to is functools.wraps'd; mypy binds no self
            .eval()
        )
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        limit = getattr(model.config, "max_position_embeddings", None) or config.model.max_model_len
        max_len = min(config.model.max_model_len, limit)
        engine = cls(model, tokenizer, config.model.name, max_len, config.hf)
        engine.sampling_defaults = model_sampling_defaults(model_dir)
        return engine

    # --- event-loop side ---------------------------------------------------------------------

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], sampling: SamplingSpec
    ) -> AsyncIterator[Delta]:
        loop = asyncio.get_running_loop()
        outbox: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        row = Row(
            request_id,
            list(prompt_token_ids),
            sampling,
            sampling.mode or self.default_mode,
            emit=lambda item: _call_soon(loop, outbox.put_nowait, item),
            generator=seeded_generator(sampling.seed, self.device),
        )
        self._rows[request_id] = row
        self._jobs.put(row)
        answered = False
        try:
            while not answered:
                item = await outbox.get()
                if isinstance(item, BaseException):
                    answered = True
                    raise item
                answered = item.finish_reason is not None
                yield item
        finally:  # finished, failed, or the caller went away: the worker drops the row
            self._aborted_total += 0 if answered else 1
            row.cancelled.set()
            self._rows.pop(request_id, None)

    async def abort(self, request_id: str) -> None:
        row = self._rows.get(request_id)
        if row is not None:
            row.cancelled.set()

    def stats(self) -> EngineStats:
        waiting = self._jobs.qsize() + len(self._deferred)
        return EngineStats(
            running=self._running, waiting=waiting, aborted_total=self._aborted_total
        )

    async def check_health(self) -> None:
        if not self._worker.is_alive():
            raise RuntimeError("the generation thread has stopped")

    def shutdown(self) -> None:
        for row in list(self._rows.values()):  # stop the running job within one step
            row.cancelled.set()
        self._jobs.put(None)
        self._worker.join(timeout=30)

    # --- worker side ---------------------------------------------------------------------------

    def _work(self) -> None:
        runners = {
            "generate": self._run_generate,
            "static-batch": self._run_generate,
            "no-cache": self._run_no_cache,
            "kv-cache": self._run_kv_cache,
        }
        while True:
            row = self._deferred.popleft() if self._deferred else self._jobs.get()
            if row is None:
                return
            if row.cancelled.is_set():
                continue
            rows = self._collect_batch(row) if row.mode == "static-batch" else [row]
            self._running = len(rows)
            started = time.perf_counter()
            for member in rows:
                member.started, member.batch_size = started, len(rows)
            error: BaseException | None = None
            try:
                with torch.inference_mode():
                    self._add_prompt_logprobs(rows)
                    runners[row.mode](rows)
            except Exception as err:  # a failed job fails its requests, not the worker
                error = err
            finally:
                self._running = 0
                self._release(rows, error)

    def _collect_batch(self, first: Row) -> list[Row]:
        """More static-batch requests that arrive within the window after the first, up to the
        batch size; other jobs taken meanwhile run after the batch, in order."""
        rows = [first]
        deadline = first.arrived + self.batch_window_s
        while len(rows) < self.max_batch_size:
            remaining = deadline - time.perf_counter()
            try:  # past the window, still take whatever is already queued (it waited anyway)
                row = self._jobs.get(
                    timeout=remaining if remaining > 0 else None, block=remaining > 0
                )
            except queue.Empty:
                break
            if row is not None and row.mode == "static-batch" and not row.cancelled.is_set():
                rows.append(row)
            else:
                self._deferred.append(row)
        return rows

    def _release(self, rows: list[Row], error: BaseException | None) -> None:
        for row in rows:
            if row.held is not None:
                row.emit(row.held)
            elif error is not None and not row.done:
                row.emit(error)
            elif not row.done:  # the loop ended without a finish (cannot happen; never hang)
                row.emit(RuntimeError("generation ended without a finish reason"))

    def _add_prompt_logprobs(self, rows: list[Row]) -> None:
        """Echo with logprobs: one more pass over the prompt (generate() keeps only the last
        position's logits)."""
        for row in rows:
            if row.spec.prompt_logprobs is not None:
                row.prompt_logprobs = prompt_logprobs(
                    self.model, row.prompt_ids, row.spec.prompt_logprobs, self.device
                )

    def _run_generate(self, rows: list[Row]) -> None:
        input_ids, attention_mask = left_pad([r.prompt_ids for r in rows], self.pad_id, self.device)
        config = GenerationConfig(
            max_new_tokens=max(r.spec.max_tokens for r in rows),
            do_sample=False,
            pad_token_id=self.pad_id,
            eos_token_id=None,
        )
        self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=config,
            logits_processor=LogitsProcessorList([PickAndStream(self, rows)]),
            stopping_criteria=StoppingCriteriaList([RowsDone(rows)]),
        )

    def _run_no_cache(self, rows: list[Row]) -> None:
        row = rows[0]
        ids = torch.tensor([row.prompt_ids], device=self.device)
        while not row.done:  # the whole sequence goes through the model again every step
            logits = self.model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1]
            token = self.step(row, logits)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)

    def _run_kv_cache(self, rows: list[Row]) -> None:
        row = rows[0]
        ids = torch.tensor([row.prompt_ids], device=self.device)
        cache = None
        while not row.done:  # the prompt once, then one new token per step
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            token = self.step(row, out.logits[0, -1])
            ids = ids.new_tensor([[token]])

    def step(self, row: Row, logits: torch.Tensor) -> int:
        """Pick one row's next token and stream it; a token is final once chosen."""
        token = choose_token(logits, row, self.eos_ids)
        if row.spec.logprobs is not None:
            row.unsent_logprobs.append(token_logprob(logits, token, row.spec.logprobs))
        self._accept(row, token)
        return token

    def _accept(self, row: Row, token: int) -> None:
        row.output_ids.append(token)
        row.token_times.append(time.perf_counter())
        row.unsent_tokens += 1
        self.tokens_generated += 1
        spec = row.spec
        count = len(row.output_ids)
        finish: FinishReason | None = None
        if token in self.eos_ids and not spec.ignore_eos:
            finish = "stop"
        text = self.tokenizer.decode(row.output_ids, skip_special_tokens=True)
        if spec.stop and count >= spec.min_tokens:
            cut = find_stop(text, spec.stop, len(row.text_sent))
            if cut is not None:
                text, finish = text[:cut], "stop"
        if finish is None and count >= spec.max_tokens:
            finish = "length"
        row.finish = finish
        if finish is None:
            self._send_partial(row, text)
        else:
            self._send_final(row, text, finish)

    def _send_partial(self, row: Row, text: str) -> None:
        if row.spec.stop:  # hold back what could be the start of a stop string
            text = text[: len(text) - (max(len(s) for s in row.spec.stop) - 1)]
        text = text.rstrip("\ufffd")  # a multi-byte character not complete yet
        new = text[len(row.text_sent) :]
        if new:
            row.text_sent += new
            row.emit(take_delta(row, new))

    def _send_final(self, row: Row, text: str, finish: FinishReason) -> None:
        extra = {"timings": row_timings(row)} if row.spec.timings else None
        delta = take_delta(row, text[len(row.text_sent) :], finish, extra)
        row.text_sent = text
        if row.mode == "static-batch":
            row.held = delta  # a static batch answers everyone when its longest row ends
        else:
            row.emit(delta)


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """End-of-sequence ids from the generation config and the tokenizer (as vLLM collects them)."""
    configured = model.generation_config.eos_token_id
    ids = configured if isinstance(configured, list) else [configured]
    ids = [i for i in [*ids, tokenizer.eos_token_id] if i is not None]
    return list(dict.fromkeys(ids))


def _call_soon(loop: asyncio.AbstractEventLoop, func: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the caller's loop is gone: nobody listens any more
        loop.call_soon_threadsafe(func, *args)
