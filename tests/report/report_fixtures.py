"""A demo-like run directory built from real episodes, for the report tests and the README screenshot.

Episodes are played through ``taskrl.rollout`` in token mode (SmolLM2's tokenizer, so segments are exact):
``shop`` with a scripted mixture whose share of expert episodes grows with the step (plus the failure modes the
monitors look for), a small notes-search env that returns ``[chunk ID]`` blocks, prunes chunks and summarises
(new segments), and a small swarm env whose sub-agents really run concurrently. Each step goes through
``Monitors`` and ``RunLog``; a final ``evaluate`` compares two policies. Run this file to refresh docs/report.png.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taskrl.chat import ChatFormat, format_tool_call
from taskrl.env import ToolEnv, make
from taskrl.eval import EvalConfig, evaluate
from taskrl.monitor import Monitors
from taskrl.policies.base import Completion, SamplingParams
from taskrl.policies.models import smollm2_tokenizer
from taskrl.policies.scripted import ScriptedPolicy
from taskrl.rollout import RolloutConfig, run_episodes
from taskrl.runlog import RunLog
from taskrl.scoring import batch_metrics
from taskrl.tools import tool
from taskrl.types import Message, Task, ToolCall, Trajectory

call = ScriptedPolicy.call
NOTES = {
    "lund#0": ("The observatory on the hill is run by the city of Lund.", True),
    "lund#1": ("Lund's observatory opened to visitors in 1867.", True),
    "fruit#0": ("Bananas are yellow when ripe and green before.", False),
    "trains#0": ("Trains to the coast leave every hour from platform 3.", False),
}


class NotesEnv(ToolEnv):
    """Search notes, prune what is irrelevant, summarise, answer. Pruning and the summary rebuild the context."""

    name = "notes"
    system_prompt = "Find the answer in the notes. Prune irrelevant chunks. Answer with the city."

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []
        self.pruned: list[str] = []
        self.summaries: list[dict[str, Any]] = []
        self.turn = 0

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [Task("notes-0", "Which city runs the observatory on the hill?", answer="Lund")]

    @tool
    def search_notes(self, query: str) -> str:
        """Search the notes.

        Args:
            query: words to look for.
        """
        hits = [cid for cid in NOTES if cid not in self.seen]
        self.seen += hits
        return "\n".join(f"[chunk {cid}]\n{NOTES[cid][0]}" for cid in hits)

    @tool
    def prune_chunks(self, chunk_ids: list[str]) -> str:
        """Remove chunks from view.

        Args:
            chunk_ids: ids of chunks to remove.
        """
        self.pruned += chunk_ids
        return f"pruned {len(chunk_ids)} chunks"

    async def step(self, tool_calls: list[ToolCall]) -> Any:
        self.turn += 1
        results, terminated, truncated, info = await super().step(tool_calls)
        if any(c.name == "prune_chunks" for c in tool_calls):
            pruned = set(self.pruned)

            def view(messages: list[Message]) -> list[Message]:
                out = []
                for m in messages:
                    if m.role == "tool" and "[chunk " in m.content:
                        blocks = m.content.split("[chunk ")
                        kept = [b for b in blocks[1:] if b.split("]")[0] not in pruned]
                        text = "".join("[chunk " + b for b in kept) or "(pruned)"
                        m = Message("tool", text, tool_call_id=m.tool_call_id, name=m.name)
                    out.append(m)
                return out

            info["context"] = view
        return results, terminated, truncated, info

    def user_turn(self, text: str) -> Any:
        """A reply starting with "Summary:" is a self-summary: the view restarts from it (a new segment)."""
        self.turn += 1
        if not text.startswith("Summary:"):
            return [], True, False, {}
        self.summaries.append({"turn": self.turn, "text": text})
        assert self.task is not None
        fresh = [Message("system", self.system_prompt), Message("user", self.task.prompt), Message("assistant", text)]
        return [Message("user", "Continue from your summary.")], False, False, {"context": [*fresh,
                Message("user", "Continue from your summary.")]}  # fmt: skip

    @staticmethod
    def scripted_rule(messages: list[Message], tools: Any) -> str:
        if any(m.role == "assistant" and m.content.startswith("Summary:") for m in messages):
            return "Lund"
        turn = sum(m.role == "assistant" for m in messages)
        script = [call("search_notes", query="observatory hill city"),
                  call("prune_chunks", chunk_ids=["fruit#0", "trains#0"]),
                  "Summary: goal: the city running the observatory. Done: searched, pruned noise. Plan: answer Lund."]
        return script[min(turn, len(script) - 1)]

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        trajectory.info["chunks"] = [{"id": cid, "tokens": len(text) // 4, "relevant": rel}
                                     for cid, (text, rel) in NOTES.items() if cid in self.seen]  # fmt: skip
        trajectory.info["pruned_chunk_ids"] = list(self.pruned)
        trajectory.info["summaries"] = list(self.summaries)
        return {"correct": float("lund" in (trajectory.final_answer or "").lower())}


class SwarmEnv(ToolEnv):
    """An orchestrator assigns research to sub-agents that run concurrently; their episodes become children."""

    name = "swarm"
    system_prompt = "Fill the table of capitals with the help of sub-agents."
    CAPITALS = {"France": "Paris", "Peru": "Lima", "Kenya": "Nairobi", "Japan": "Tokyo"}

    def __init__(self) -> None:
        super().__init__()
        self.children: list[Trajectory] = []
        self.created: list[str] = []
        self.t0 = time.monotonic()

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [Task("capitals", "Capitals of France, Peru, Kenya and Japan?", answer="Paris Lima Nairobi Tokyo")]

    @tool
    def create_subagent(self, name: str, system_prompt: str) -> str:
        """Create a sub-agent.

        Args:
            name: its name.
            system_prompt: its instructions.
        """
        self.created.append(name)
        return f"created {name}"

    @tool
    async def assign_task(self, agent_id: str, task: str) -> str:
        """Give a sub-agent a task; returns its final answer.

        Args:
            agent_id: the sub-agent's name.
            task: what it should do.
        """
        country = task.split()[-1].rstrip("?")
        start = time.monotonic() - self.t0
        await asyncio.sleep(0.03 * len(country))  # longer names take longer: waves get a clear critical member
        answer = self.CAPITALS.get(country, "unknown")
        child = Trajectory(task_id=f"{agent_id}: {country}", env="swarm-sub", trainable=False, terminated=True,
                           messages=[Message("system", "You are a researcher."), Message("user", task),
                                     Message("assistant", answer)])  # fmt: skip
        child.info.update({"name": agent_id, "started_at": start, "ended_at": time.monotonic() - self.t0,
                           "final_answer": answer})  # fmt: skip
        child.metrics["turns"] = 1.0
        self.children.append(child)
        return answer

    @staticmethod
    def scripted_rule(messages: list[Message], tools: Any) -> str:
        turn = sum(m.role == "assistant" for m in messages)
        if turn == 0:
            return "".join(format_tool_call("create_subagent", {"name": f"r{i}", "system_prompt": "research"})
                           for i in range(3))  # fmt: skip
        if turn == 1:  # three at once, then one more: two waves
            return "".join(call("assign_task", agent_id=f"r{i}", task=f"Capital of {c}")
                           for i, c in enumerate(["France", "Peru", "Kenya"]))  # fmt: skip
        if turn == 2:
            return call("assign_task", agent_id="r0", task="Capital of Japan")
        return "Paris Lima Nairobi Tokyo"

    def reward(self, trajectory: Trajectory) -> dict[str, float | None]:
        trajectory.children = list(self.children)
        trajectory.info.update({"started_at": 0.0, "ended_at": time.monotonic() - self.t0})
        turns = [m for m in trajectory.messages if m.role == "assistant"]
        trajectory.metrics["critical_steps"] = float(len(turns) + sum(1 for m in turns if any(
            c.name == "assign_task" for c in m.tool_calls)))  # each wave waits for one 1-step sub-agent
        found = sum(v in (trajectory.final_answer or "") for v in self.CAPITALS.values())
        return {"perf": found / len(self.CAPITALS), "parallel": 0.1}


class Mixture(ScriptedPolicy):
    """The shop expert in a share ``p`` of episodes, else a failure mode (give up, malformed call, loop)."""

    def __init__(self, p_expert: float, chat_format: ChatFormat) -> None:
        expert = make("shop").scripted_rule
        self.p = p_expert

        def rule(messages: list[Message], tools: Any) -> str:
            mode = self._mode
            if mode == "expert":
                return expert(messages, tools)
            turn = sum(m.role == "assistant" for m in messages)
            if mode == "give_up":
                return "I am not sure, maybe 10?"
            if mode == "malformed":
                return ['<tool_call>{"name": "lookup_price", "arguments": {"item": </tool_call>',
                        "The total is 12."][min(turn, 1)]  # fmt: skip
            return call("lookup_price", item="apple") if turn < 3 else "The total is 9."  # a loop

        super().__init__(rule, name=f"mixture-{p_expert:.2f}", chat_format=chat_format)
        self._mode = "expert"

    async def generate(self, *, sampling: SamplingParams, **kwargs: Any) -> Completion:
        turn = sum(m.role == "assistant" for m in kwargs.get("messages") or [])
        episode = ((sampling.seed or 0) - turn) & 0x7FFFFFFF  # the loop seeds turn t with episode_seed * c + t
        rng = random.Random(episode)
        self._mode = "expert" if rng.random() < self.p else rng.choice(["give_up", "malformed", "loop"])
        # safe with concurrent episodes: the parent calls the rule before its first await
        return await super().generate(sampling=sampling, **kwargs)


async def build_demo_like_run(run_dir: Path, *, steps: int = 6, tasks_per_step: int = 6) -> Path:
    """Write a run directory with ``steps`` logged steps, alerts, trajectories of three envs and an evaluation."""
    fmt = ChatFormat(smollm2_tokenizer())
    log = RunLog(run_dir)
    log.write_config({"command": "report fixture (scripted, not a trained model)", "steps": steps, "env": "shop"})
    shop = make("shop")
    tool_names = [*shop.tools.names, *NotesEnv().tools.names, *SwarmEnv().tools.names]
    monitors = Monitors(tool_names=tool_names)
    for step in range(steps):
        policy = Mixture(min(1.0, 0.25 + 0.15 * step), fmt)
        tasks = list(shop.tasks())[step * tasks_per_step : (step + 1) * tasks_per_step]
        batch = await run_episodes(lambda: make("shop"), policy, tasks, RolloutConfig(group_size=2, max_turns=6,
                                                                                      seed=step))  # fmt: skip
        notes_env = NotesEnv()
        batch += await run_episodes(lambda e=notes_env: e, ScriptedPolicy(NotesEnv.scripted_rule, chat_format=fmt),
                                    notes_env.tasks(), RolloutConfig(max_turns=6, seed=step))  # fmt: skip
        swarm_env = SwarmEnv()
        batch += await run_episodes(lambda e=swarm_env: e, ScriptedPolicy(SwarmEnv.scripted_rule, chat_format=fmt),
                                    swarm_env.tasks(), RolloutConfig(max_turns=6, seed=step))  # fmt: skip
        shop_batch = [t for t in batch if t.env == "shop"]
        summary = batch_metrics(shop_batch)
        metrics, alerts = monitors.check(step, batch)
        log.log(step, {
            "rewards/mean": summary["rewards/total"], "rewards/correct": summary.get("rewards/correct", 0.0),
            "tools/tool_calls": summary["tools/tool_calls"],
            "tools/invalid_tool_calls": summary["tools/invalid_tool_calls"], "charts/episodes": float(len(batch)),
            "charts/sampled_tokens": summary["charts/mean_sampled_tokens"],
            "charts/success_rate": sum(t.reward >= 1.0 for t in shop_batch) / len(shop_batch), **metrics,
        })  # fmt: skip
        for alert in alerts:
            log.alert(**alert.to_dict())
        log.write_trajectories(step, batch)
    policies = {"expert rule": ScriptedPolicy(shop.scripted_rule, chat_format=fmt), "mixture p=0.5": Mixture(0.5, fmt)}
    eval_config = EvalConfig(samples_per_task=3, pass_ks=(1,), bootstrap_resamples=500)
    await evaluate(lambda: make("shop"), policies, list(shop.tasks("test"))[:6], eval_config, run_log=log,
                   name="final", step=steps - 1)  # fmt: skip
    return run_dir


def main(png: str = "docs/report.png") -> None:
    """Refresh the README screenshot: build the run in a temp dir, render the report, open the notes episode
    (pruned chunks, a summary, rebuilt contexts) and save the whole page."""
    import tempfile

    from taskrl.report import build_report
    from taskrl.report.browser import HeadlessChromium

    with tempfile.TemporaryDirectory() as tmp:
        run = asyncio.run(build_demo_like_run(Path(tmp) / "demo", steps=6))
        html = build_report(run, Path(tmp) / "report.html", title="demo-like run (scripted policies)")
        with HeadlessChromium(width=1360, height=900) as browser:
            browser.open(html, ready="!!document.body && document.body.dataset.ready === '1'")
            browser.evaluate("(() => { const f = document.getElementById('traj-filter'); f.value = 'observatory';"
                             " f.dispatchEvent(new Event('input')); })()")  # fmt: skip
            browser.click("tr.traj-row")
            browser.evaluate("window.scrollTo(0, 0)")
            shot = browser.screenshot(Path(png), full_page=True)
    try:  # a 256-colour palette keeps the committed PNG small (text and flat charts lose nothing visible)
        from PIL import Image

        Image.open(shot).convert("RGB").quantize(colors=256).save(shot, optimize=True)
    except ImportError:
        pass
    print(shot, f"{shot.stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main(*sys.argv[1:])
