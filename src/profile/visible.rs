//! [`VisibleGpus`]: the GPUs a process sees, as `CUDA_VISIBLE_DEVICES` names them, and the one
//! parser of that variable.
//!
//! Unset means every GPU; set, it lists GPUs by index or UUID (prefix), and a list with no
//! names in it (`""`, `","`, a profile's `gpus = []`) means none: CUDA then shows no device.
//! Places that need a GPU refuse an empty set with their own message rather than widening it
//! to every GPU, which is what a tuner once did with `gpus = []`.

use std::fmt;

/// The GPUs a process sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleGpus {
    /// `CUDA_VISIBLE_DEVICES` unset (a run's `gpus` is then `all`): every GPU of the node.
    Every,
    /// These GPUs, in the order given; empty: none.
    Listed(Vec<GpuName>),
}

/// One GPU as `CUDA_VISIBLE_DEVICES` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuName {
    /// Its index on the node (`2`).
    Index(u32),
    /// Its UUID or a prefix of it (`GPU-8f3a`).
    Uuid(String),
}

/// A name in the list that is no GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGpu(pub String);

impl fmt::Display for UnknownGpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CUDA_VISIBLE_DEVICES names `{}`, which is no GPU of this node",
            self.0
        )
    }
}

impl std::error::Error for UnknownGpu {}

impl VisibleGpus {
    /// The variable's value (None: unset). `all`, what a run reports when it is unset, is every
    /// GPU too.
    pub fn parse(value: Option<&str>) -> VisibleGpus {
        let Some(v) = value else {
            return VisibleGpus::Every;
        };
        if v.trim() == "all" {
            return VisibleGpus::Every;
        }
        let names = v
            .split(',')
            .map(str::trim)
            .filter(|w| !w.is_empty())
            .map(|w| match w.parse::<u32>() {
                Ok(i) => GpuName::Index(i),
                Err(_) => GpuName::Uuid(w.to_string()),
            })
            .collect();
        VisibleGpus::Listed(names)
    }

    /// A list of indices (a profile's `gpus = [0, 2]`).
    pub fn indices(list: &[u32]) -> VisibleGpus {
        VisibleGpus::Listed(list.iter().map(|&i| GpuName::Index(i)).collect())
    }

    /// No GPU at all.
    pub fn is_none(&self) -> bool {
        matches!(self, VisibleGpus::Listed(l) if l.is_empty())
    }

    /// The indices of the node's GPUs (each `(index, uuid)`) this set names, in its order and
    /// without repeats; every GPU for [`VisibleGpus::Every`]. A name that is no GPU of the
    /// node is an error naming it.
    pub fn resolve<'a>(
        &self,
        node: impl IntoIterator<Item = (u32, Option<&'a str>)>,
    ) -> Result<Vec<u32>, UnknownGpu> {
        let node: Vec<(u32, Option<&str>)> = node.into_iter().collect();
        let names = match self {
            VisibleGpus::Every => return Ok(node.iter().map(|(i, _)| *i).collect()),
            VisibleGpus::Listed(names) => names,
        };
        let mut out = Vec::new();
        for name in names {
            let found = match name {
                GpuName::Index(i) => node.iter().find(|(g, _)| g == i),
                GpuName::Uuid(prefix) => node
                    .iter()
                    .find(|(_, u)| u.is_some_and(|u| u.starts_with(prefix.as_str()))),
            };
            match found {
                Some((g, _)) if !out.contains(g) => out.push(*g),
                Some(_) => {}
                None => return Err(UnknownGpu(name.to_string())),
            }
        }
        Ok(out)
    }
}

impl VisibleGpus {
    /// The node's GPUs this set names, skipping names that are none of them (a run's set
    /// against a snapshot, where a GPU may be gone); None for [`VisibleGpus::Every`].
    pub fn known<'a>(
        &self,
        node: impl IntoIterator<Item = (u32, Option<&'a str>)>,
    ) -> Option<std::collections::BTreeSet<u32>> {
        let VisibleGpus::Listed(names) = self else {
            return None;
        };
        let node: Vec<(u32, Option<&str>)> = node.into_iter().collect();
        Some(
            names
                .iter()
                .filter_map(|name| match name {
                    GpuName::Index(i) => node.iter().any(|(g, _)| g == i).then_some(*i),
                    GpuName::Uuid(prefix) => node
                        .iter()
                        .find(|(_, u)| u.is_some_and(|u| u.starts_with(prefix.as_str())))
                        .map(|(g, _)| *g),
                })
                .collect(),
        )
    }
}

impl fmt::Display for GpuName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GpuName::Index(i) => write!(f, "{i}"),
            GpuName::Uuid(u) => f.write_str(u),
        }
    }
}

/// The variable's value, or `all` for every GPU (as a run's `gpus` reports it).
impl fmt::Display for VisibleGpus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VisibleGpus::Every => f.write_str("all"),
            VisibleGpus::Listed(names) => {
                let words: Vec<String> = names.iter().map(GpuName::to_string).collect();
                f.write_str(&words.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> Vec<(u32, Option<&'static str>)> {
        vec![(0, Some("GPU-0aaa")), (1, Some("GPU-1bbb")), (2, None)]
    }

    #[test]
    fn unset_and_all_are_every_gpu() {
        for v in [None, Some("all"), Some(" all ")] {
            let set = VisibleGpus::parse(v);
            assert_eq!(set, VisibleGpus::Every, "{v:?}");
            assert_eq!(set.resolve(node()).unwrap(), [0, 1, 2]);
            assert!(!set.is_none());
        }
    }

    #[test]
    fn an_empty_list_is_no_gpu_not_every_gpu() {
        for v in ["", ",", " , ,", "  "] {
            let set = VisibleGpus::parse(Some(v));
            assert!(set.is_none(), "{v:?}");
            assert_eq!(set.resolve(node()).unwrap(), Vec::<u32>::new(), "{v:?}");
        }
        assert!(VisibleGpus::indices(&[]).is_none());
        assert_eq!(VisibleGpus::indices(&[]).to_string(), "");
    }

    #[test]
    fn indices_and_uuid_prefixes_in_order_without_repeats() {
        let set = VisibleGpus::parse(Some("2, GPU-0,1,2"));
        assert_eq!(set.resolve(node()).unwrap(), [2, 0, 1]);
        assert_eq!(set.to_string(), "2,GPU-0,1,2");
        assert_eq!(VisibleGpus::indices(&[1, 0]).to_string(), "1,0");
        let e = VisibleGpus::parse(Some("0,7")).resolve(node()).unwrap_err();
        assert_eq!(e, UnknownGpu("7".into()));
        assert!(e.to_string().contains("`7`"), "{e}");
        let e = VisibleGpus::parse(Some("-1")).resolve(node()).unwrap_err();
        assert!(e.to_string().contains("`-1`"), "{e}");
        let e = VisibleGpus::parse(Some("GPU-9"))
            .resolve(node())
            .unwrap_err();
        assert!(e.to_string().contains("`GPU-9`"), "{e}");
    }

    #[test]
    fn known_skips_what_the_node_lacks_and_every_is_none() {
        assert_eq!(VisibleGpus::parse(None).known(node()), None);
        assert_eq!(VisibleGpus::parse(Some("all")).known(node()), None);
        let set = VisibleGpus::parse(Some("GPU-1b, 7, 0"))
            .known(node())
            .unwrap();
        assert_eq!(set.into_iter().collect::<Vec<_>>(), [0, 1]);
        let set = VisibleGpus::parse(Some("GPU-zzz")).known(node()).unwrap();
        assert!(set.is_empty());
        assert!(
            VisibleGpus::parse(Some(","))
                .known(node())
                .unwrap()
                .is_empty()
        );
    }
}
