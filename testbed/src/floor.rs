//! The loopback floor: what one request/response costs on 127.0.0.1 on this machine right now,
//! with nothing of ours in the way. A 1-byte ping-pong over a `TCP_NODELAY` connection between
//! two OS threads (blocking sockets, so each round trip is two wake-ups through the kernel's
//! loopback path). `testbed load --measure-floor` measures it just before and just after the
//! load (back to back, [`ping_pong`]) and, paced, while the load runs ([`PacedProbe`]), so the
//! allocate latencies of the same run can be given as multiples of it: the floor moves with the
//! machine's load (~15–60 µs on the project's 2-core VM), absolute figures across runs do not
//! compare.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Percentiles of one set of round trips, µs.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RoundTrips {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

impl RoundTrips {
    fn of(h: &Histogram<u64>) -> RoundTrips {
        RoundTrips {
            count: h.len(),
            p50_us: h.value_at_quantile(0.5),
            p99_us: h.value_at_quantile(0.99),
            max_us: h.max(),
        }
    }
}

/// A connected pair on 127.0.0.1 with an echo thread on one end; dropping the client end ends
/// the echo thread.
struct EchoPair {
    client: TcpStream,
    echo: Option<std::thread::JoinHandle<()>>,
}

impl EchoPair {
    fn open() -> std::io::Result<EchoPair> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let client = TcpStream::connect(listener.local_addr()?)?;
        let (server, _) = listener.accept()?;
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let echo = std::thread::Builder::new()
            .name("floor-echo".into())
            .spawn(move || echo(server))?;
        Ok(EchoPair {
            client,
            echo: Some(echo),
        })
    }

    /// One round trip: a byte out, the same byte back.
    fn round_trip(&mut self) -> std::io::Result<Duration> {
        let mut byte = [0x2a_u8];
        let began = Instant::now();
        self.client.write_all(&byte)?;
        self.client.read_exact(&mut byte)?;
        Ok(began.elapsed())
    }
}

impl Drop for EchoPair {
    fn drop(&mut self) {
        let _ = self.client.shutdown(std::net::Shutdown::Both);
        if let Some(echo) = self.echo.take() {
            let _ = echo.join();
        }
    }
}

/// Echo every byte until the peer closes.
fn echo(mut server: TcpStream) {
    let mut byte = [0u8; 1];
    while server.read_exact(&mut byte).is_ok() {
        if server.write_all(&byte).is_err() {
            return;
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::new(3).expect("valid sigfig")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let _ = h.record(u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1));
}

/// `round_trips` back-to-back 1-byte round trips (after `round_trips / 10` unrecorded ones to
/// warm the path up). Blocks the calling thread: call it outside an async runtime's workers.
pub fn ping_pong(round_trips: usize) -> std::io::Result<RoundTrips> {
    let mut pair = EchoPair::open()?;
    for _ in 0..round_trips / 10 {
        pair.round_trip()?;
    }
    let mut h = histogram();
    for _ in 0..round_trips {
        record(&mut h, pair.round_trip()?);
    }
    Ok(RoundTrips::of(&h))
}

/// Round trips at a fixed pace on a thread of its own while something else runs: what the
/// loopback costs under that load, for a request that finds both ends idle (as an app's
/// occasional `allocate` does). Bounded: at most `max_round_trips`, then it stops by itself.
pub struct PacedProbe {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<std::io::Result<Histogram<u64>>>,
}

impl PacedProbe {
    pub fn start(every: Duration, max_round_trips: usize) -> std::io::Result<PacedProbe> {
        let mut pair = EchoPair::open()?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("floor-probe".into())
            .spawn(move || {
                let mut h = histogram();
                while !stopped.load(Ordering::Relaxed) && (h.len() as usize) < max_round_trips {
                    std::thread::sleep(every);
                    record(&mut h, pair.round_trip()?);
                }
                Ok(h)
            })?;
        Ok(PacedProbe { stop, thread })
    }

    /// Stop and return what was measured.
    pub fn finish(self) -> std::io::Result<RoundTrips> {
        self.stop.store(true, Ordering::Relaxed);
        let h = self
            .thread
            .join()
            .map_err(|_| std::io::Error::other("the floor probe thread panicked"))??;
        Ok(RoundTrips::of(&h))
    }
}

/// The floor of one run and the run's allocate latencies as multiples of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct FloorReport {
    /// Back-to-back round trips just before the load.
    pub before: RoundTrips,
    /// Back-to-back round trips just after the load.
    pub after: RoundTrips,
    /// Paced round trips (one every `paced_every_ms`) while the load ran.
    pub during: RoundTrips,
    pub paced_every_ms: u64,
    /// The floor the ratios divide by: the mean of `before.p50_us` and `after.p50_us`.
    pub floor_p50_us: f64,
    /// `allocate_queueable.p50_us / floor_p50_us`, and so on (0 when that type had no ask).
    pub queueable_p50_ratio: f64,
    pub queueable_p99_ratio: f64,
    pub guaranteed_p50_ratio: f64,
    pub guaranteed_p99_ratio: f64,
}

impl FloorReport {
    /// The floor from the three measurements, and the ratios of the given allocate latencies
    /// (p50, p99 in µs per type; `None` for a type with no ask) to it.
    pub fn new(
        before: RoundTrips,
        after: RoundTrips,
        during: RoundTrips,
        paced_every: Duration,
        queueable: Option<(u64, u64)>,
        guaranteed: Option<(u64, u64)>,
    ) -> FloorReport {
        let floor = (before.p50_us + after.p50_us) as f64 / 2.0;
        let ratio = |v: u64| {
            if floor > 0.0 {
                (v as f64 / floor * 100.0).round() / 100.0
            } else {
                0.0
            }
        };
        let (q50, q99) = queueable.map_or((0.0, 0.0), |(a, b)| (ratio(a), ratio(b)));
        let (g50, g99) = guaranteed.map_or((0.0, 0.0), |(a, b)| (ratio(a), ratio(b)));
        FloorReport {
            before,
            after,
            during,
            paced_every_ms: u64::try_from(paced_every.as_millis()).unwrap_or(u64::MAX),
            floor_p50_us: floor,
            queueable_p50_ratio: q50,
            queueable_p99_ratio: q99,
            guaranteed_p50_ratio: g50,
            guaranteed_p99_ratio: g99,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_pong_counts_every_round_trip() {
        let rt = ping_pong(200).unwrap();
        assert_eq!(rt.count, 200);
        assert!(rt.p50_us >= 1 && rt.p50_us <= rt.p99_us && rt.p99_us <= rt.max_us);
    }

    #[test]
    fn a_paced_probe_stops_at_its_bound() {
        let probe = PacedProbe::start(Duration::from_micros(10), 50).unwrap();
        // It stops by itself at 50; `finish` only collects.
        let rt = loop {
            if probe.thread.is_finished() {
                break probe.finish().unwrap();
            }
            std::thread::yield_now();
        };
        assert_eq!(rt.count, 50);
    }

    #[test]
    fn ratios_divide_by_the_mean_of_the_two_idle_floors() {
        let at = |p50| RoundTrips {
            count: 1,
            p50_us: p50,
            p99_us: p50,
            max_us: p50,
        };
        let r = FloorReport::new(
            at(20),
            at(30),
            at(100),
            Duration::from_millis(5),
            Some((50, 250)),
            None,
        );
        assert_eq!(r.floor_p50_us, 25.0);
        assert_eq!(r.queueable_p50_ratio, 2.0);
        assert_eq!(r.queueable_p99_ratio, 10.0);
        assert_eq!(r.guaranteed_p50_ratio, 0.0);
        assert_eq!(r.paced_every_ms, 5);
    }
}
