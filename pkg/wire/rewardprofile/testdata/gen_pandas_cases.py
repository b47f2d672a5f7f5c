"""Generates pandas_cases.jsonl (one case a line): verify replies and the /aggregate_metrics reply
pandas computes for them, for rewardprofile's TestComputeMatchesPandas.

It follows compute_aggregate_metrics and RewardProfiler.profile_from_data of
nemo_gym/reward_profile.py (NeMo Gym 07d6b0d07b22) step by step, with two
changes for an older pandas (Debian 12's 1.5.3, numpy 1.24.2): each group is
described without its key column (what include_groups=False does), and the
stack is unrolled (stat-major, columns in frame order, as stack orders it).
Bottleneck is off, as in an environment without it (Gym does not require it).
Run: /usr/bin/python3 gen_pandas_cases.py > pandas_cases.jsonl
"""
import json
import math
import random

import pandas as pd

pd.set_option("compute.use_bottleneck", False)

TASK, ROLL = "_ng_task_index", "_ng_rollout_index"
STATS = ["mean", "max", "min", "median", "std"]


def describe(df):
    d = [df.mean(), df.max(), df.min(), df.median(), df.std()]
    if d[4].isna().all():
        not_na = df.columns[df.notna().all()]
        d[4][not_na] = d[4][not_na].fillna(0)
    out = {}
    for name, series in zip(STATS, d):
        for col in df.columns:
            v = series[col]
            if v is None or pd.isna(v):
                continue
            out[f"{name}/{col}"] = v.item() if hasattr(v, "item") else v
    return out


def rollout_info(result):
    info = {"rollout_id": f"{result[TASK]}:{result[ROLL]}", TASK: result[TASK], ROLL: result[ROLL]}
    if "reward" in result:
        info["reward"] = result.get("reward")
    usage = (result.get("response") or {}).get("usage") or {}
    for k, v in usage.items():
        if isinstance(v, bool):
            info[k] = int(v)
        elif isinstance(v, (int, float)):
            info[k] = v
    for k, v in result.items():
        if k in {TASK, ROLL, "reward", "response"}:
            continue
        if isinstance(v, bool):
            info[k] = int(v)
        elif isinstance(v, (int, float)):
            info[k] = v
    return info


def aggregate(vrs):
    if not vrs:
        return {"group_level_metrics": [], "agent_metrics": {}, "key_metrics": {}}
    results = sorted((vr if "response" in vr else {**vr, "response": {}} for vr in vrs), key=lambda r: (r[TASK], r[ROLL]))
    recs, infos = [], {}
    for r in results:
        infos.setdefault(r[TASK], []).append(rollout_info(r))
        merged = r | (r["response"].get("usage") or {})
        rec = {"agent_name": "agent", TASK: r[TASK], ROLL: r[ROLL]}
        for k, v in merged.items():
            if isinstance(v, bool):
                rec[k] = int(v)
            elif isinstance(v, (int, float)):
                rec[k] = v
        recs.append(rec)
    df = pd.DataFrame.from_records(recs)
    groups = []
    for task, sub in df.drop(columns=[ROLL, "agent_name"]).groupby(TASK):
        g = {TASK: int(task)}
        g.update(describe(sub.drop(columns=[TASK])))
        n = len(infos[task])
        g["sample"] = {"agent_ref": {"name": "agent"}}
        g["num_rollouts"] = n
        g["expected_num_rollouts"] = n
        g["missing_num_rollouts"] = 0
        g["reward_profile_completion_pct"] = 100.0
        g["rollout_infos"] = sorted(infos[task], key=lambda r: r[ROLL])
        groups.append(g)
    agent = describe(df.drop(columns=[ROLL, TASK, "agent_name"]))
    return {
        "group_level_metrics": groups,
        "agent_metrics": agent,
        "key_metrics": {k: v for k, v in agent.items() if k.startswith("mean/")},
    }


def random_reply(rng, task, roll):
    vr = {TASK: task, ROLL: roll}
    r = rng.random()
    if r < 0.3:
        vr["reward"] = float(rng.random() < 0.5)
    elif r < 0.6:
        vr["reward"] = rng.random() * 10 ** rng.randint(-3, 3)
    elif r < 0.8:
        vr["reward"] = rng.randint(0, 5)
    if rng.random() < 0.5:
        vr["correct"] = rng.random() < 0.5
    if rng.random() < 0.4:
        vr["score"] = rng.gauss(0, 1)
    if rng.random() < 0.3:
        vr["label"] = "x"
    if rng.random() < 0.8:
        usage = {"input_tokens": rng.randint(1, 500), "output_tokens": rng.randint(1, 500)}
        usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
        usage["input_tokens_details"] = {"cached_tokens": 0}
        vr["response"] = {"usage": usage}
    return vr


def main():
    rng = random.Random(32)
    cases = []
    for _ in range(30):
        vrs = []
        for task in range(rng.randint(1, 4)):
            for roll in range(rng.randint(1, 12)):
                vrs.append(random_reply(rng, task * 3, roll))
        rng.shuffle(vrs)
        cases.append({"verify_responses": vrs, "expected": json.dumps(aggregate(vrs), separators=(",", ":"))})
    # Long columns, past numpy's 8-wide and 128-element summation blocks.
    vrs = [{TASK: 0, ROLL: i, "reward": rng.random() * 10 ** rng.randint(-3, 3)} for i in range(300)]
    cases.append({"verify_responses": vrs, "expected": json.dumps(aggregate(vrs), separators=(",", ":"))})
    print("\n".join(json.dumps(c, separators=(",", ":")) for c in cases))


main()
