"""Generation backends implementing :class:`optima_env.policy.ChatPolicy`.

Each backend imports its heavy dependencies lazily, inside the module that needs them:

* :mod:`optima_env.backends.hf`: Hugging Face transformers, batched, CPU or GPU.
"""
