//! Trying an action again: a schedule (how many tries, the pause after a
//! failed one), pure, and one loop that takes its sleeper from the caller,
//! so that tests run it without waiting.

use std::time::Duration;

/// How often an action is tried, and how long apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub tries: u32,
    /// The pause after each failed try.
    pub pause: Duration,
}

impl Retry {
    /// Setting a requeued job's exclusion list: Slurm takes it only once
    /// the job no longer runs, while it tears the job down (a running job's
    /// cannot be changed; SLURM-FACTS). 20 tries 100 ms apart, about 2 s.
    pub const EXCLUSION: Retry = Retry {
        tries: 20,
        pause: Duration::from_millis(100),
    };

    /// The pauses, one after each failed try, in order.
    pub fn pauses(self) -> impl Iterator<Item = Duration> {
        std::iter::repeat_n(self.pause, self.tries as usize)
    }

    /// Run `op` until it succeeds or the tries are spent, handing `sleep`
    /// the pause after each failed try. The error is the last try's (`None`
    /// only when no try was allowed).
    pub fn run<T, E>(
        self,
        mut op: impl FnMut() -> Result<T, E>,
        mut sleep: impl FnMut(Duration),
    ) -> Result<T, Option<E>> {
        let mut last = None;
        for pause in self.pauses() {
            match op() {
                Ok(v) => return Ok(v),
                Err(e) => {
                    last = Some(e);
                    sleep(pause);
                }
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exclusion_is_tried_twenty_times_a_tenth_of_a_second_apart() {
        let pauses: Vec<Duration> = Retry::EXCLUSION.pauses().collect();
        assert_eq!(pauses.len(), 20);
        assert!(pauses.iter().all(|p| *p == Duration::from_millis(100)));
        assert_eq!(pauses.iter().sum::<Duration>(), Duration::from_secs(2));
    }

    #[test]
    fn a_success_stops_the_tries_and_each_failure_is_followed_by_its_pause() {
        let mut tries = 0;
        let mut slept = Vec::new();
        let r = Retry::EXCLUSION.run(
            || {
                tries += 1;
                if tries < 3 {
                    Err(format!("try {tries}"))
                } else {
                    Ok(tries)
                }
            },
            |d| slept.push(d),
        );
        assert_eq!(r, Ok(3));
        assert_eq!(slept, [Duration::from_millis(100); 2]);
    }

    #[test]
    fn when_every_try_fails_the_last_error_is_returned() {
        let mut tries = 0;
        let mut slept = Duration::ZERO;
        let r: Result<(), _> = Retry::EXCLUSION.run(
            || {
                tries += 1;
                Err(tries)
            },
            |d| slept += d,
        );
        assert_eq!(r, Err(Some(20)));
        assert_eq!((tries, slept), (20, Duration::from_secs(2)));
        let none = Retry {
            tries: 0,
            pause: Duration::from_secs(1),
        };
        assert_eq!(none.run(|| Err::<(), _>(()), |_| unreachable!()), Err(None));
    }
}
