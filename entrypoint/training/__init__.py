"""Training: run ``libreyolo train`` as a supervised child process (one node or torchrun), and keep it going.

The command and the child (``process``), several machines (``launch``, ``ddp_worker``), signs of
progress (``liveness``), the optional dashboard and profile (``monitor``, ``profiling``), and the two
ways a run continues: after a preemption (``resume``) and after running out of GPU memory (``oom``). The job's
training stage, which watches the trainer and heals it in place, is ``job/loop.py``, above this wing.
"""
