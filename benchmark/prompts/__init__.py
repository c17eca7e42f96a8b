"""A task's prompts: the sources of training and evaluation prompts (``sources``), local files in Flow-GRPO's formats
(``files``) and Hugging Face datasets on disk (``local_datasets``); the tiny tier's prompt files lie in this folder."""
