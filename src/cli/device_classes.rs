//! `migdra device-classes`: the DeviceClasses for this node's MIG profiles (or for every model's),
//! with the extended resource names of NVIDIA's device plugin, as a table or as manifests to
//! apply; with `--slurm-bridge`, slurm-bridge's `deviceProfiles` for the same classes.
//!
//! `-o yaml` is a stream of DeviceClass documents (what `daemonset/base/deviceclasses.yaml` is made
//! of); `-o json` is a `v1` `List`. Both go straight to `kubectl apply -f -`.

use super::{CliError, CliResult, Format, Global, output, profiles};
use crate::kube::device_classes::{self, Class, Naming, Selects};
use serde::Serialize;
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// GPU model (e.g. h100-80gb); without it, the models of --sim, of the GPUs behind --sim-state
    /// or --nvml-lib or --driver-root (a live node), or every model
    #[arg(long, env = "MIGDRA_MODEL")]
    pub model: Option<String>,
    /// Only these profiles, comma-separated (e.g. 1g.10gb,3g.40gb) [default: every profile of the models]
    #[arg(long, value_delimiter = ',', value_name = "PROFILE")]
    pub profiles: Vec<String>,
    /// Before the profile in each class name
    #[arg(long, env = "MIGDRA_CLASS_PREFIX", default_value = "mig-", value_name = "PREFIX")]
    pub class_prefix: String,
    /// Before the profile in each extended resource name (NVIDIA's device plugin: nvidia.com/mig-);
    /// empty for none
    #[arg(long, env = "MIGDRA_EXTENDED_RESOURCE_PREFIX", default_value = "nvidia.com/mig-", value_name = "PREFIX")]
    pub extended_resource_prefix: String,
    /// The whole-GPU class's extended resource name; empty for none
    #[arg(long, env = "MIGDRA_GPU_EXTENDED_RESOURCE", default_value = "nvidia.com/gpu", value_name = "NAME")]
    pub gpu_extended_resource: String,
    /// Print slurm-bridge's `deviceProfiles` for these classes instead (whole GPUs; with
    /// --static-mig each profile too)
    #[arg(long)]
    pub slurm_bridge: bool,
    /// With --slurm-bridge: also a profile per MIG profile, for nodes whose MIG instances an
    /// administrator made (a dynamic node publishes overlapping partitions, one GRES unit each)
    #[arg(long)]
    pub static_mig: bool,
}

/// `kubectl`'s list of objects.
#[derive(Serialize)]
struct List<T: Serialize> {
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    kind: &'static str,
    items: Vec<T>,
}

/// slurm-bridge's configuration, the part these classes need.
#[derive(Serialize)]
struct BridgeConfig {
    #[serde(rename = "deviceProfiles")]
    device_profiles: Vec<device_classes::BridgeProfile>,
}

pub fn run(args: &Args, global: &Global, out: &mut dyn Write) -> CliResult {
    if args.static_mig && !args.slurm_bridge {
        return Err(CliError::Usage("--static-mig: only with --slurm-bridge (it adds slurm-bridge profiles)".into()));
    }
    let driver = &global.node.driver_name;
    let classes = classes(args, global)?;
    if args.slurm_bridge {
        let config =
            BridgeConfig { device_profiles: device_classes::bridge_profiles(driver, &classes, args.static_mig) };
        return match global.output {
            Format::Json => Ok(output::json(out, &config)?),
            Format::Yaml | Format::Table => {
                writeln!(out, "# slurm-bridge deviceProfiles for migdra's DeviceClasses ({driver}).")?;
                writeln!(out, "# {}", generated_by(args))?;
                Ok(output::yaml(out, &config)?)
            }
        };
    }
    match global.output {
        Format::Table => table(&classes, out)?,
        Format::Json => {
            let items = classes.iter().map(device_classes::device_class).collect();
            output::json(out, &List { api_version: "v1", kind: "List", items })?;
        }
        Format::Yaml => {
            writeln!(out, "# DeviceClasses for migdra's devices ({driver}), resource.k8s.io/v1.")?;
            writeln!(out, "# {}", generated_by(args))?;
            for c in &classes {
                writeln!(out, "---")?;
                output::yaml(out, &device_classes::device_class(c))?;
            }
        }
    }
    Ok(())
}

/// The classes for the selected models' profiles, in catalog order, or for `--profiles`.
fn classes(args: &Args, global: &Global) -> Result<Vec<Class>, CliError> {
    let models = profiles::models(args.model.as_deref(), global)?;
    let mut known: Vec<String> = Vec::new();
    for m in &models {
        for p in &m.profiles {
            if !known.contains(&p.name) {
                known.push(p.name.clone());
            }
        }
    }
    let wanted = if args.profiles.is_empty() {
        known
    } else {
        let keys: Vec<&str> = models.iter().map(|m| m.key.as_str()).collect();
        for p in &args.profiles {
            if !known.contains(p) {
                return Err(CliError::Usage(format!(
                    "--profiles {p:?}: no class, since no selected model ({}) has that profile; valid: {}",
                    keys.join(", "),
                    known.join(", ")
                )));
            }
        }
        args.profiles.clone()
    };
    let naming = Naming {
        class_prefix: args.class_prefix.clone(),
        resource_prefix: args.extended_resource_prefix.clone(),
        gpu_resource: (!args.gpu_extended_resource.is_empty()).then(|| args.gpu_extended_resource.clone()),
    };
    device_classes::classes(&global.node.driver_name, &wanted, &naming).map_err(|e| CliError::Usage(e.to_string()))
}

/// The header line naming the command that printed the output, so a file can be regenerated.
fn generated_by(args: &Args) -> String {
    let mut cmd = String::from("migdra device-classes");
    if let Some(m) = &args.model {
        cmd.push_str(&format!(" --model {m}"));
    }
    if !args.profiles.is_empty() {
        cmd.push_str(&format!(" --profiles {}", args.profiles.join(",")));
    }
    if args.slurm_bridge {
        cmd.push_str(if args.static_mig { " --slurm-bridge --static-mig" } else { " --slurm-bridge" });
    }
    format!("Made by `{cmd} -o yaml`; each class has exactly one CEL selector.")
}

fn table(classes: &[Class], out: &mut dyn Write) -> std::io::Result<()> {
    let rows: Vec<Vec<String>> = classes
        .iter()
        .map(|c| {
            let selects = match &c.selects {
                Selects::AnyMig => "any MIG device".to_string(),
                Selects::WholeGpu => "a whole GPU".to_string(),
                Selects::Profile(p) => format!("MIG {p}"),
            };
            vec![c.name.clone(), c.extended_resource_name.clone().unwrap_or_else(|| "-".into()), selects]
        })
        .collect();
    output::table(out, &["CLASS", "EXTENDED RESOURCE", "SELECTS"], &rows)
}
