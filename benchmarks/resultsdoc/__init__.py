"""benchmarks/RESULTS.md and the proof record in tests/gpu/README.md, generated from the result files so that no
figure in them can drift from its JSON (the command: benchmarks/results_doc.py).

Where each thing is decided:
- sections.py: what the document says, in order (SECTIONS), as data;
- topics/: how each topic's rows and prose come out of its files' JSON;
- entries.py: the entry types (Table, Text, Image, Section); document.py: rendering them into RESULTS.md;
- provenance.py: the line naming each file's revision, host, date and command;
- proofs.py: the proof record; formatting.py: how numbers print; paths.py: where the files live."""
