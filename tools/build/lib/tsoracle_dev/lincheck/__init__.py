"""Linearizability runs: a multi-process workload under a nemesis, checked by Porcupine (the
Go checker in this folder) and by fast Python invariants."""
