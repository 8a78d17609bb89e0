"""Experiments over runs (an application on top of the library): seed x variant sweeps of one recipe
(:mod:`.sweep`), runs and sweeps side by side (:mod:`.report`), and the figures both draw (:mod:`.plots`)."""
