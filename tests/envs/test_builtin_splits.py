"""`shop` and `price`: held-out splits share no (item, quantity) pair with training; item bounds; lookup credit."""

from __future__ import annotations

import pytest
from price_episodes import episode

from taskrl.envs.builtin import PRICES, PriceEnv, ShopEnv, held_out_pair, make_shop_tasks
from taskrl.types import Task


def _pairs(tasks: list[Task]) -> set[tuple[str, int]]:
    out = set()
    for task in tasks:
        order = task.info.get("order") or {task.info["item"]: task.info["quantity"]}
        out |= set(order.items())
    return out


@pytest.mark.parametrize("held_out", ["test", "val"])
def test_held_out_splits_share_no_item_quantity_pair_with_training(held_out: str) -> None:
    for env in (ShopEnv(num_tasks=200), PriceEnv(num_tasks=200), ShopEnv(num_tasks=200, min_items=2, max_items=2)):
        train, other = _pairs(list(env.tasks("train"))), _pairs(list(env.tasks(held_out)))
        assert train and other and not train & other, type(env).__name__
        assert all(held_out_pair(item, q) for item, q in other) and not any(held_out_pair(i, q) for i, q in train)
    assert {item for item, _ in _pairs(list(ShopEnv(num_tasks=200).tasks(held_out)))} == set(PRICES)
    assert len({item for item, _ in _pairs(list(PriceEnv(num_tasks=200).tasks(held_out)))}) == 9  # quantities 1-3


def test_item_bounds_and_bad_bounds() -> None:
    tasks = ShopEnv(num_tasks=50, min_items=2, max_items=2).tasks("test")
    assert all(len(t.info["order"]) == 2 for t in tasks)
    assert all(t.answer == sum(PRICES[i] * q for i, q in t.info["order"].items()) for t in tasks)
    assert make_shop_tasks(8, 0) == make_shop_tasks(8, 0, min_items=1, max_items=3)
    with pytest.raises(ValueError, match="min_items"):
        ShopEnv(min_items=3, max_items=2)
    with pytest.raises(ValueError, match="lookup_credit"):
        ShopEnv(lookup_credit=1.0)


def test_lookup_credit_pays_the_right_lookups_and_never_reaches_a_right_answer() -> None:
    env = ShopEnv(num_tasks=4, min_items=2, max_items=2, lookup_credit=0.3)
    task = env.tasks("train")[0]
    env.reset(task)
    first, second = task.info["order"]
    others = [item for item in PRICES if item not in task.info["order"]]

    def reward(looked_up: list[str], answer: str = "0") -> float:
        return sum(v for v in env.reward(episode(task, looked_up, answer)).values() if v is not None)

    assert reward([first, second], str(task.answer)) == 1.0
    assert reward([first, second]) == pytest.approx(0.3)
    assert reward([first]) == pytest.approx(0.2)  # F1 of 1 of 2 items
    assert reward(others[:1]) == 0.0 and reward(["caviar"]) == 0.0  # a wrong or failed lookup earns nothing
    assert reward(sorted(PRICES)) < reward([first]), "looking everything up pays less than one right lookup"
    plain = ShopEnv(num_tasks=1, min_items=2, max_items=2)
    plain.reset(task)
    assert plain.reward(episode(task, [first, second], "0")) == {"correct": 0.0}, "no credit unless asked for"
