"""The batchsim benchmark suite: how fast the simulator runs, not what it predicts.

``python -m bench`` (``make bench``) times fixed ShareGPT-like scenarios
(:mod:`bench.scenarios`) for each policy, at a moderate and a saturating
load, on one replica and on four, at 10k, 100k and 1M requests. Each case
runs in its own process under a time and memory budget (:mod:`bench.runner`),
the results go to ``bench/results/<label>.json`` and ``.md``, and the run is
compared with the previous result file by calibration-normalised wall time
(:mod:`bench.compare`). See docs/performance.md.
"""
