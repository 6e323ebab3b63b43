"""Experiment trackers: write a run's per-step metrics to TensorBoard / W&B offline / CSV under a framework's key
names (`rcdiag export`), read those files back with the trackers' own libraries, and hold a trainer's logged
curves against what the run's tokens give (`rcdiag crosscheck`).

    from rcdiag.trackers.export import export_run
    from rcdiag.trackers.crosscheck import crosscheck
"""
