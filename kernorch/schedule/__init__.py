"""Schedules (Rammer): rPrograms of a plan's units placed on virtual execution units (program.py), the
dependencies between them (hazards.py), the wavefront policy (wavefront.py), the runtime chosen per region
(regions.py) and a simulator (simulate.py)."""
