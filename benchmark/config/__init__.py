"""A run's configuration: the typed schema and its overrides (``schema``), the recipe files and their values
(``recipe_files``, ``recipes``), the search spaces and the tuned layer (``search_space``, ``tuned``, ``tuning_design``),
the checks of values and of knob combinations (``argument_ranges``, ``inert``), and the resolver that orders the layers
(``resolve``: the front door every command goes through). Imports the prompt sources below it and nothing above."""
