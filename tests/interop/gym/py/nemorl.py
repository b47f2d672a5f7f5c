"""What NeMo RL does with a NeMo Gym result, without torch or a tokenizer.

NeMo RL (NVIDIA-NeMo/RL @ 7ea279abfbeb, nemo_rl/environments/nemo_gym.py) reads each
(row, result) pair that RolloutCollectionHelper.run_examples yields:

- run_rollouts (lines ~655-750): every row must carry agent_ref.name
  (_require_resolved_agent_refs, Counter(row["agent_ref"]["name"])), and the row's
  _rowidx is what it yields the result under;
- _postprocess_nemo_gym_to_nemo_rl_result (lines ~752-1017): over result["response"]["output"],
  every item with a truthy generation_token_ids (_is_trainable_output_item) is a turn:
  the token ids seen so far must be a prefix of its prompt_token_ids ("Non-contiguous
  messages found!"), then prompt_token_ids, generation_token_ids and
  generation_log_probs are popped and the new prompt ids and the generation appended;
  no turn at all is an error ("NeMo Gym returned a result with no generation data");
- rollout_manager.py (line ~1030): float(result["full_result"]["reward"]).

This module reproduces those reads on plain lists, so a result our fleet returns is
checked the way NeMo RL would check it.
"""


class NeMoRLReadError(AssertionError):
    pass


def is_trainable_output_item(item):
    # nemo_gym.py _is_trainable_output_item
    return bool(item.get("generation_token_ids"))


def postprocess(row, result):
    """Returns NeMo RL's message log summary for one result, or raises NeMoRLReadError."""
    if not (row.get("agent_ref") or {}).get("name"):
        raise NeMoRLReadError(f"row has no agent_ref after run_examples: {row}")
    if not isinstance(result, dict):
        raise NeMoRLReadError(f"Hit a non-successful response when querying NeMo Gym for rollouts: {result}")
    seen = []
    turns = []
    for item in result["response"]["output"]:
        if not is_trainable_output_item(item):
            continue
        prompt = item["prompt_token_ids"]
        if seen != prompt[: len(seen)]:
            raise NeMoRLReadError(
                "Non-contiguous messages found! "
                f"seen {len(seen)} token ids, the next prompt's first {len(seen)} differ"
            )
        generation = item["generation_token_ids"]
        logprobs = item["generation_log_probs"]
        if len(logprobs) != len(generation):
            raise NeMoRLReadError(f"{len(logprobs)} log probs for {len(generation)} generated tokens")
        if not all(isinstance(x, float) for x in logprobs):
            raise NeMoRLReadError("generation_log_probs must be floats (torch.tensor of them)")
        new_prompt = prompt[len(seen):]
        turns.append({"prompt_tokens": len(new_prompt), "generation_tokens": len(generation)})
        seen.extend(new_prompt)
        seen.extend(generation)
    if not turns:
        raise NeMoRLReadError(
            "NeMo Gym returned a result with no generation data; output item types: "
            f"{[o.get('type') for o in result['response']['output']]}"
        )
    return {
        "rowidx": row.get("_rowidx"),
        "task_index": row.get("_ng_task_index"),
        "agent": row["agent_ref"]["name"],
        "reward": float(result["reward"]),
        "turns": turns,
        "tokens": len(seen),
        "episode_id": result.get("episode_id"),
    }
