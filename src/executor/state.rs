//! The executor state machine, as a pure type so its rules can be tested
//! on their own. The diagram is the doc of [`State`]; what each state
//! means for the runtime is in `src/executor/README.md`.

/// The state of one executor, as [`Handle::state`](crate::Handle::state)
/// reports it.
///
/// ```text
///            pin                    unpin
///  Resident ─────► Pinned ─────────────────► Resident
///     │  ▲            └── panic in a &mut task ──► Poisoned
///     │  │ write failed
///     │  └────────── Evicting ◄── evict (dirty) ── Resident
///     │                 │ written
///     ├─ evict (clean) ─┴──────► Evicted ── load ──► Loading ──► Resident
///     │                                                 └─ damaged ─► Damaged
///     └─ remove ──► Removed
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
#[non_exhaustive]
pub enum State {
    /// In memory, no task running: may be evicted.
    Resident = 0,
    /// A task runs on it: never evicted.
    Pinned = 1,
    /// Being written to its spill file.
    Evicting = 2,
    /// Not in memory: in its spill file, or (an executor with a
    /// [`Lineage`](crate::Lineage) that is still clean) to be rebuilt from
    /// its source.
    Evicted = 3,
    /// Being read back from disk, or rebuilt from its lineage.
    Loading = 4,
    /// A task panicked while it had `&mut` access.
    Poisoned = 5,
    /// Its spill file could not be read back, or its lineage failed.
    Damaged = 6,
    /// Removed from the runtime.
    Removed = 7,
}

/// What a caller should do next when it wants to run a task on an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PinStep {
    /// Take the value and run the task.
    Pin,
    /// Load it from disk first.
    Load,
    /// Another thread is moving it: wait for a state change.
    Wait,
    /// The task cannot run.
    Fail,
}

/// What an evictor may do with an executor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EvictStep {
    /// Drop the memory: the spill file is still valid.
    DropClean,
    /// Write the value, then drop it.
    Write,
    /// Not evictable now.
    Skip,
}

impl State {
    pub(crate) fn from_code(c: u8) -> State {
        match c {
            0 => State::Resident,
            1 => State::Pinned,
            2 => State::Evicting,
            3 => State::Evicted,
            4 => State::Loading,
            5 => State::Poisoned,
            6 => State::Damaged,
            _ => State::Removed,
        }
    }

    /// The next step for a task that wants this executor.
    pub(crate) fn pin_step(self) -> PinStep {
        match self {
            State::Resident => PinStep::Pin,
            State::Evicted => PinStep::Load,
            State::Pinned | State::Evicting | State::Loading => PinStep::Wait,
            State::Poisoned | State::Damaged | State::Removed => PinStep::Fail,
        }
    }

    /// The step an evictor may take. `dirty` says memory differs from the
    /// spill file; `has_file` says a valid spill file exists.
    pub(crate) fn evict_step(self, dirty: bool, has_file: bool) -> EvictStep {
        match self {
            State::Resident if !dirty && has_file => EvictStep::DropClean,
            State::Resident => EvictStep::Write,
            _ => EvictStep::Skip,
        }
    }

    /// Whether the executor's memory is in use (counts towards the cap).
    pub fn in_memory(self) -> bool {
        matches!(
            self,
            State::Resident | State::Pinned | State::Evicting | State::Poisoned
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [State; 8] = [
        State::Resident,
        State::Pinned,
        State::Evicting,
        State::Evicted,
        State::Loading,
        State::Poisoned,
        State::Damaged,
        State::Removed,
    ];

    #[test]
    fn codes_roundtrip() {
        for s in ALL {
            assert_eq!(State::from_code(s as u8), s);
        }
    }

    #[test]
    fn only_resident_executors_are_evicted() {
        for s in ALL {
            for dirty in [false, true] {
                for has_file in [false, true] {
                    let step = s.evict_step(dirty, has_file);
                    if s != State::Resident {
                        assert_eq!(step, EvictStep::Skip, "{s:?} must not be evicted");
                    }
                }
            }
        }
        assert_eq!(State::Pinned.evict_step(false, true), EvictStep::Skip);
    }

    #[test]
    fn clean_eviction_needs_a_valid_file() {
        assert_eq!(
            State::Resident.evict_step(false, true),
            EvictStep::DropClean
        );
        assert_eq!(State::Resident.evict_step(false, false), EvictStep::Write);
        assert_eq!(State::Resident.evict_step(true, true), EvictStep::Write);
    }

    #[test]
    fn pin_steps() {
        assert_eq!(State::Resident.pin_step(), PinStep::Pin);
        assert_eq!(State::Evicted.pin_step(), PinStep::Load);
        for s in [State::Pinned, State::Evicting, State::Loading] {
            assert_eq!(s.pin_step(), PinStep::Wait);
        }
        for s in [State::Poisoned, State::Damaged, State::Removed] {
            assert_eq!(s.pin_step(), PinStep::Fail);
        }
    }
}
