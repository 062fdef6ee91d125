"""What a person reads: the Chrome/Perfetto trace (:mod:`.trace`), topology drawings (:mod:`.draw`) and the
self-contained HTML report (:mod:`.html`)."""
