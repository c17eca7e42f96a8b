"""Statistics over run directories: reading runs (``runs``), targets (``targets``), the one statistics path
(``effects``, ``stats``, ``aggregate``), what a gain cost (``costs``), and results as a dataset (``results_dataset``)."""
