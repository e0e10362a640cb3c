"""The benchmarks' shared library: how they time, what they write, the inputs they share.

* :mod:`lib.timing` -- every timing method (device time with CUDA events, L2 flushed or warm,
  CUDA graphs, host time, interleaved rounds) and the smoke mode that turns each into one call;
* :mod:`lib.results` -- machine info (date, commit, device, versions) and the result file;
* :mod:`lib.smoke` -- ``--smoke`` on a CPU: Triton's interpreter, set before Triton loads;
* :mod:`lib.steps` -- the serving-step shapes of the metadata benchmarks;
* :mod:`lib.replay_step` -- one serving step's replay metadata, vLLM's way and the pack's;
* :mod:`lib.sparse_mla` -- sparse-MLA inputs, baselines, checks, kernel columns, record caches.

A script in ``bench/`` imports it as ``lib`` (Python puts the script's folder first on
``sys.path``); one in ``bench/experiments/`` puts ``bench/`` there first. No benchmark imports
another: what two scripts share lives here. Importing ``lib`` imports nothing else.
"""
