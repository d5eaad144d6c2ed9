"""Supervised fine-tuning (``method: sft``): conversations (built by :mod:`sailrl.runtime.prompts.conversations`)
become ``cross_entropy`` datums whose weights train the assistant turns only (:mod:`.datums`), and a run trains on
them (:mod:`.run`: ``SupervisedRun``, what ``compiler/templates/sft.py.j2``'s ``main()`` drives), with its step
records (:mod:`.records`) and checkpoints (:mod:`.checkpoints`).

The run pieces (opening, records, checkpoints, resume) take no SFT-specific data, so another method that trains
on fixed data (DPO) builds on them."""
