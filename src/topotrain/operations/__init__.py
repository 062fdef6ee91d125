"""Operations over weeks: what fails in a cluster and how often (:mod:`.failures`), what checkpoints cost and
how often to take them (:mod:`.checkpoint`), a Monte-Carlo of the whole run under failures and recovery
policies (:mod:`.longrun`), the iteration a degraded job runs at (:mod:`.degraded`), the checkpoint interval
and spares chosen together (:mod:`.tuning`), and the ``run-long`` study that joins them (:mod:`.study`);
docs/operations.md."""
