"""The maxMemory webhook: charges each allocation of a maxMemory tenant in its ledger, exactly."""
