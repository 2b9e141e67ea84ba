"""Stand-in inference engine for the local test cluster (no model, no accelerator).

One stdlib-only package, shipped inside each stand-in engine wheel (vllm, sglang, tokenspeed) beside
that release's flag catalog; the wheel's real console script (``vllm serve``, ``sglang serve``,
``tokenspeed serve``, ``python -m sglang.launch_server``) runs it. What a user or a deploy can observe
behaves like the pinned release:

* argv: every flag must be in the release's catalog (else ``PROG: error: ...`` on one stderr line and
  exit 2, as argparse); registry values (parsers, load formats, KV connectors, speculative methods)
  must be known to it and ``--load-format fastsafetensors`` needs the ``fastsafetensors`` package
  (else one line and exit 1).
* weights: the model directory needs ``config.json``, ``model.safetensors.index.json`` and every shard
  it names, each with a readable safetensors header whose tensors fill the file exactly (a truncated
  or corrupt shard fails, exit 1); the context length may not exceed what ``config.json`` allows.
* ``--host/--port`` (vllm 0.0.0.0:8000, sglang 127.0.0.1:30000, tokenspeed 0.0.0.0:8000),
  ``--served-model-name``, ``--max-model-len``/``--context-length``; the API key comes from
  ``--api-key``, ``VLLM_API_KEY`` (vllm) or the ``--config`` YAML (sglang ``api-key:``).
* load time ``KIMI_STANDIN_LOAD_SECONDS`` (default 1.0): /health answers 503, then 200.
* HTTP: ``GET /health``, ``/v1/models`` (with ``max_model_len``), ``/metrics``, ``/version``;
  ``POST /v1/chat/completions`` and ``/v1/completions``, answered by :mod:`kimi_standin.answer`.
* multi-node: the leader listens on its rendezvous port; workers (``--headless`` or node rank > 0)
  wait until that port accepts, serve no HTTP and stay up.
* stderr: a start line, then ``ready``; SIGTERM or SIGINT ends it with exit 0.
* the cluster's fault knob: while ``/etc/kimi-standin-faults.json`` holds ``{"answer": TEXT}``, every
  completion answers TEXT with status 200 (an engine answering garbage, for the watchdog's drills).
"""
