"""What a recorded trace says, for the `analyze` command (exporter/commands/analyze.py)
and the scripts: the observable band (band.py, gpu_models.py), the gaps in the samples
(gaps.py), the swings, ramps and dips (swings.py, events.py), the goodput account
(goodput.py), the report (report.py), the request they are all handed (request.py), and
InfiniteHBD-Trace's faults as our events (infinitehbd.py, for `lemons`)."""
