"""The scheduler's pure core: deciding where VMs go from a read-only snapshot, with no
storage, ledger or network behind it."""
