// Command migdra-kubelet runs, in one process, the node-side DRA code of the real kubelet, so
// that migdra's tests talk to the client that runs on a node rather than to a stand-in:
//
//   - the kubelet's plugin manager (k8s.io/kubernetes/pkg/kubelet/pluginmanager) watching a
//     plugins_registry directory, with the DRA manager's handler for "DRAPlugin";
//   - the DRA manager (k8s.io/kubernetes/pkg/kubelet/cm/dra) with its checkpoint in a state
//     directory: PrepareResources, GetResources, UnprepareResources, the health stream and
//     UpdateAllocatedResourcesStatus;
//   - the CDI library a container runtime uses (tags.cncf.io/container-device-interface), over
//     migdra's CDI directory, injecting the devices into an OCI runtime spec.
//
// What it does not have: a container runtime (the OCI spec is built and reported, nothing is
// started), pod workers (a test says when to prepare, unprepare and read the health status) and
// the reconcile loop that unprepares the claims of vanished pods (it would need every pod of the
// node; sourcesReady is never ready, as in a kubelet whose sources have not synced yet).
//
// Protocol: one JSON command per line on stdin, one JSON answer per line on stdout; logs go to
// stderr. A command that fails answers {"ok":false,"error":"..."}; nothing ends the process but
// {"cmd":"exit"}, the end of stdin or a signal. The commands:
//
//	{"cmd":"wait-registered","driver":D,"timeout_ms":N,"after":K,"endpoint_contains":S}
//	{"cmd":"prepare","namespace":NS,"pod":P}
//	{"cmd":"unprepare","namespace":NS,"pod":P}
//	{"cmd":"allocated-status","namespace":NS,"pod":P}
//	{"cmd":"events"}
//	{"cmd":"exit"}
//
// The code shared by every Kubernetes version is this file; compat.go beside it holds the calls
// whose signatures differ between versions (hack/kubelet-1.37 links this file and has its own).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginregistration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// The gates the health path needs. ResourceHealthStatus is beta (on) from 1.36 and alpha before;
// ResourceHealthStatusMessage exists from 1.36 only, so a gate this version lacks is reported and
// skipped rather than fatal.
var featureGates = []string{"ResourceHealthStatus", "ResourceHealthStatusMessage"}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	nodeName := flag.String("node-name", "", "the Node this kubelet runs (its ResourceSlices are wiped at start, as the kubelet does)")
	registryDir := flag.String("registry-dir", "", "plugins_registry directory the plugin manager watches")
	stateDir := flag.String("state-dir", "", "the DRA manager's checkpoint directory")
	cdiDir := flag.String("cdi-dir", "", "CDI spec directory (migdra's --cdi-dir)")
	stubMinors := flag.String("stub-nvidia-minors", "", "comma-separated GPU minors: run in a private mount namespace whose /dev holds stub NVIDIA device nodes for them")
	klog.InitFlags(nil)
	flag.Parse()
	for name, v := range map[string]string{"kubeconfig": *kubeconfig, "node-name": *nodeName, "registry-dir": *registryDir, "state-dir": *stateDir, "cdi-dir": *cdiDir} {
		if v == "" {
			fatal(fmt.Errorf("--%s is required", name))
		}
	}
	if *stubMinors != "" {
		if err := stubDevNodes(*stubMinors); err != nil {
			fatal(err)
		}
	}
	h, err := start(*kubeconfig, *nodeName, *registryDir, *stateDir, *cdiDir)
	if err != nil {
		fatal(err)
	}
	h.serve(os.Stdin, os.Stdout)
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "migdra-kubelet: %v\n", err)
	os.Exit(1)
}

// event is one thing the plugin manager or the DRA manager did, with its time.
type event struct {
	// Milliseconds since the harness started, and since the Unix epoch (to compare with the
	// test's own clock).
	Ms     int64    `json:"ms"`
	UnixMs int64    `json:"unix_ms"`
	Kind   string   `json:"kind"` // validate, register, deregister, health-update
	Driver string   `json:"driver,omitempty"`
	Path   string   `json:"endpoint,omitempty"`
	Vers   []string `json:"versions,omitempty"`
	Error  string   `json:"error,omitempty"`
	Pods   []string `json:"pods,omitempty"`
}

type recorder struct {
	start  time.Time
	mu     sync.Mutex
	events []event
}

func (r *recorder) add(e event) {
	now := time.Now()
	e.Ms, e.UnixMs = now.Sub(r.start).Milliseconds(), now.UnixMilli()
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func (r *recorder) all() []event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// recordingHandler is the DRA manager's own plugin handler, only watched: every call goes to it
// unchanged, so registration is exactly the kubelet's.
type recordingHandler struct {
	inner cache.PluginHandler
	rec   *recorder
}

// The handler's methods are in compat.go (their signatures changed in 1.37); they call these.
func (h recordingHandler) validated(name, endpoint string, versions []string, err error) error {
	h.rec.add(event{Kind: "validate", Driver: name, Path: endpoint, Vers: versions, Error: errString(err)})
	return err
}

func (h recordingHandler) registered(name, endpoint string, versions []string, err error) error {
	h.rec.add(event{Kind: "register", Driver: name, Path: endpoint, Vers: versions, Error: errString(err)})
	return err
}

func (h recordingHandler) deregistered(name, endpoint string) {
	h.rec.add(event{Kind: "deregister", Driver: name, Path: endpoint})
}

type harness struct {
	ctx    context.Context
	client kubernetes.Interface
	dra    *dra.Manager
	cdi    *cdi.Cache
	rec    *recorder
	gates  map[string]string
	// The pods this kubelet was told about, as last read: unprepare and the health status
	// still work once a pod is deleted from the API server.
	mu   sync.Mutex
	pods map[string]*v1.Pod
}

func start(kubeconfig, nodeName, registryDir, stateDir, cdiDir string) (*harness, error) {
	rec := &recorder{start: time.Now(), events: []event{}}
	gates := map[string]string{}
	for _, g := range featureGates {
		if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(map[string]bool{g: true}); err != nil {
			gates[g] = err.Error()
		} else {
			gates[g] = "true"
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.UserAgent = "migdra-kubelet"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(stateDir, 0o750); err != nil {
		return nil, err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	go func() { <-ctx.Done(); cancel(); os.Exit(0) }()
	logger := klog.Background()
	ctx = klog.NewContext(ctx, logger)

	manager, err := dra.NewManager(logger, client, stateDir)
	if err != nil {
		return nil, fmt.Errorf("DRA manager: %w", err)
	}
	never := config.NewSourcesReady(func(sets.Set[string]) bool { return false })
	getNode := func(ctx context.Context) (*v1.Node, error) {
		return client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	}
	h := &harness{ctx: ctx, client: client, dra: manager, rec: rec, gates: gates, pods: map[string]*v1.Pod{}}
	if err := startDRA(ctx, manager, h.activePods, getNode, never); err != nil {
		return nil, fmt.Errorf("DRA manager start: %w", err)
	}
	// The kubelet turns each update into a pod status sync; here it is recorded, and a test
	// reads the status with allocated-status.
	go func() {
		for u := range manager.Updates() {
			rec.add(event{Kind: "health-update", Pods: u.PodUIDs})
		}
	}()

	// No auto-refresh: like containerd, refresh right before each injection, and report what the
	// refresh found wrong.
	h.cdi, err = cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		klog.InfoS("CDI cache", "err", err) // errors are per file; prepare reports them
	}

	pm := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	// GetWatcherHandler is valid only after Start (it needs Start's context).
	pm.AddHandler(pluginregistration.DRAPlugin, recordingHandler{inner: manager.GetWatcherHandler(), rec: rec})
	go runPluginManager(ctx, pm, never, ctx.Done())
	klog.InfoS("migdra-kubelet started", "registryDir", registryDir, "stateDir", stateDir, "cdiDir", cdiDir, "featureGates", gates)
	return h, nil
}

func (h *harness) activePods() []*v1.Pod {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*v1.Pod, 0, len(h.pods))
	for _, p := range h.pods {
		out = append(out, p)
	}
	return out
}

type request struct {
	Cmd              string `json:"cmd"`
	Driver           string `json:"driver"`
	TimeoutMs        int64  `json:"timeout_ms"`
	After            int    `json:"after"`
	EndpointContains string `json:"endpoint_contains"`
	Namespace        string `json:"namespace"`
	Pod              string `json:"pod"`
}

type answer map[string]any

func (h *harness) serve(in *os.File, out *os.File) {
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	enc := json.NewEncoder(out)
	for scanner.Scan() {
		line := strings.TrimSpace(scanner.Text())
		if line == "" {
			continue
		}
		a := h.handle(line)
		if err := enc.Encode(a); err != nil {
			fatal(err)
		}
		if a["exit"] == true {
			return
		}
	}
}

func (h *harness) handle(line string) (a answer) {
	defer func() {
		if p := recover(); p != nil {
			a = answer{"ok": false, "error": fmt.Sprintf("panic: %v", p)}
		}
	}()
	var req request
	if err := json.Unmarshal([]byte(line), &req); err != nil {
		return answer{"ok": false, "error": fmt.Sprintf("bad command %q: %v", line, err)}
	}
	var err error
	switch req.Cmd {
	case "wait-registered":
		a, err = h.waitRegistered(req)
	case "prepare":
		a, err = h.prepare(req)
	case "unprepare":
		a, err = h.unprepare(req)
	case "allocated-status":
		a, err = h.allocatedStatus(req)
	case "events":
		a = answer{"events": h.rec.all(), "feature_gates": h.gates}
	case "exit":
		a = answer{"exit": true}
	default:
		err = fmt.Errorf("unknown command %q (known: wait-registered, prepare, unprepare, allocated-status, events, exit)", req.Cmd)
	}
	if err != nil {
		if a == nil {
			a = answer{}
		}
		a["ok"], a["error"] = false, err.Error()
		return a
	}
	a["ok"] = true
	return a
}

// waitRegistered waits for a successful RegisterPlugin of the driver among the events from index
// `after` on, made by the plugin manager after it dialed the registration socket.
func (h *harness) waitRegistered(req request) (answer, error) {
	if req.Driver == "" {
		return nil, errors.New("wait-registered needs a driver")
	}
	deadline := time.Now().Add(time.Duration(req.TimeoutMs) * time.Millisecond)
	for {
		events := h.rec.all()
		for i := min(req.After, len(events)); i < len(events); i++ {
			e := events[i]
			if e.Kind == "register" && e.Driver == req.Driver && e.Error == "" && strings.Contains(e.Path, req.EndpointContains) {
				return answer{"ms": e.Ms, "unix_ms": e.UnixMs, "endpoint": e.Path, "index": i, "events": events}, nil
			}
		}
		if time.Now().After(deadline) {
			return answer{"events": events}, fmt.Errorf("driver %s not registered by the plugin manager within %d ms", req.Driver, req.TimeoutMs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pod reads the pod from the API server; once it is gone, the copy last read.
func (h *harness) pod(ns, name string, mustExist bool) (*v1.Pod, error) {
	if ns == "" || name == "" {
		return nil, errors.New("needs namespace and pod")
	}
	key := ns + "/" + name
	pod, err := h.client.CoreV1().Pods(ns).Get(h.ctx, name, metav1.GetOptions{})
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.pods[key] = pod
		return pod, nil
	}
	if cached, ok := h.pods[key]; ok && !mustExist {
		return cached, nil
	}
	return nil, fmt.Errorf("get pod %s: %w", key, err)
}

type deviceNode struct {
	Path     string `json:"path"`
	Type     string `json:"type"`
	Major    int64  `json:"major"`
	Minor    int64  `json:"minor"`
	FileMode string `json:"file_mode,omitempty"`
}

type container struct {
	Name        string              `json:"name"`
	CDIIDs      []string            `json:"cdi_ids"`
	DeviceNodes []deviceNode        `json:"device_nodes"`
	CgroupAllow []string            `json:"cgroup_allow"`
	Env         []string            `json:"env"`
	Mounts      []oci.Mount         `json:"mounts"`
	Hooks       int                 `json:"hooks"`
	Unresolved  []string            `json:"unresolved,omitempty"`
	Error       string              `json:"error,omitempty"`
	CDIErrors   map[string][]string `json:"cdi_errors,omitempty"`
}

func (h *harness) prepare(req request) (answer, error) {
	pod, err := h.pod(req.Namespace, req.Pod, true)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	err = h.dra.PrepareResources(h.ctx, pod)
	a := answer{"pod_uid": string(pod.UID), "prepare_ms": time.Since(t).Milliseconds()}
	if err != nil {
		return a, err
	}
	var containers []container
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		info, err := h.dra.GetResources(pod, c)
		if err != nil {
			containers = append(containers, container{Name: c.Name, Error: "GetResources: " + err.Error()})
			continue
		}
		var ids []string
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		containers = append(containers, h.inject(c.Name, ids))
	}
	a["containers"] = containers
	return a, nil
}

const basePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// inject does what a CDI-enabled runtime does with the kubelet's device IDs: refresh the cache,
// resolve, and apply the edits to the container's OCI spec.
func (h *harness) inject(name string, ids []string) container {
	out := container{Name: name, CDIIDs: ids}
	if h.cdi == nil {
		out.Error = "no CDI cache"
		return out
	}
	if err := h.cdi.Refresh(); err != nil {
		out.Error = "CDI refresh: " + err.Error()
	}
	for file, errs := range h.cdi.GetErrors() {
		if out.CDIErrors == nil {
			out.CDIErrors = map[string][]string{}
		}
		for _, e := range errs {
			out.CDIErrors[file] = append(out.CDIErrors[file], e.Error())
		}
	}
	spec := &oci.Spec{Version: oci.Version, Process: &oci.Process{Env: []string{basePath}}, Linux: &oci.Linux{}}
	if len(ids) == 0 {
		return out
	}
	unresolved, err := h.cdi.InjectDevices(spec, ids...)
	out.Unresolved = unresolved
	if err != nil {
		out.Error = strings.TrimPrefix(out.Error+"; ", "; ") + "CDI inject: " + err.Error()
		return out
	}
	for _, d := range spec.Linux.Devices {
		n := deviceNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor}
		if d.FileMode != nil {
			n.FileMode = fmt.Sprintf("%#o", uint32(*d.FileMode))
		}
		out.DeviceNodes = append(out.DeviceNodes, n)
	}
	if spec.Linux.Resources != nil {
		for _, d := range spec.Linux.Resources.Devices {
			num := func(p *int64) string {
				if p == nil {
					return "*"
				}
				return strconv.FormatInt(*p, 10)
			}
			out.CgroupAllow = append(out.CgroupAllow, fmt.Sprintf("%s %s:%s %s", d.Type, num(d.Major), num(d.Minor), d.Access))
		}
	}
	for _, e := range spec.Process.Env {
		if e != basePath {
			out.Env = append(out.Env, e)
		}
	}
	out.Mounts = spec.Mounts
	if spec.Hooks != nil {
		out.Hooks = len(spec.Hooks.CreateRuntime) + len(spec.Hooks.CreateContainer) + len(spec.Hooks.StartContainer) + len(spec.Hooks.Poststart) + len(spec.Hooks.Poststop) + len(spec.Hooks.Prestart)
	}
	return out
}

func (h *harness) unprepare(req request) (answer, error) {
	pod, err := h.pod(req.Namespace, req.Pod, false)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	err = h.dra.UnprepareResources(h.ctx, pod)
	a := answer{"pod_uid": string(pod.UID), "unprepare_ms": time.Since(t).Milliseconds()}
	if err == nil {
		h.mu.Lock()
		delete(h.pods, req.Namespace+"/"+req.Pod)
		h.mu.Unlock()
	}
	return a, err
}

// allocatedStatus is the part of the kubelet's pod status sync that DRA fills in: each
// container's allocatedResourcesStatus from the health the driver streamed.
func (h *harness) allocatedStatus(req request) (answer, error) {
	pod, err := h.pod(req.Namespace, req.Pod, false)
	if err != nil {
		return nil, err
	}
	status := &v1.PodStatus{}
	for _, c := range pod.Spec.Containers {
		status.ContainerStatuses = append(status.ContainerStatuses, v1.ContainerStatus{Name: c.Name})
	}
	updateAllocatedResourcesStatus(h.dra, pod, status)
	return answer{"pod_uid": string(pod.UID), "container_statuses": status.ContainerStatuses}, nil
}

// stubDevNodes re-executes this program in a private mount namespace whose /dev is a tmpfs with
// the few nodes a process needs plus stub NVIDIA nodes (the numbers the NVIDIA driver gives them:
// /dev/nvidia<minor> is 195:<minor>, nvidiactl 195:255; nvidia-uvm's major is dynamic, 235 here).
// The CDI library stats every device node a spec names by path alone, as a runtime does on a
// GPU node; without these it would fail on a machine with no GPU. The GI/CI capability nodes
// are not stubbed: migdra's spec carries their numbers, which is what the test checks.
func stubDevNodes(minors string) error {
	const marker = "MIGDRA_KUBELET_STUB_DEV"
	if os.Getenv(marker) == "" {
		cmd := exec.Command("/proc/self/exe", os.Args[1:]...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.Env = append(os.Environ(), marker+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			os.Exit(exit.ExitCode())
		}
		if err != nil {
			return fmt.Errorf("private mount namespace for --stub-nvidia-minors (needs CAP_SYS_ADMIN and CAP_MKNOD): %w", err)
		}
		os.Exit(0)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if err := syscall.Mount("tmpfs", "/dev", "tmpfs", syscall.MS_NOSUID, "mode=755"); err != nil {
		return fmt.Errorf("tmpfs on /dev: %w", err)
	}
	nodes := map[string][2]uint32{
		"null": {1, 3}, "zero": {1, 5}, "full": {1, 7}, "random": {1, 8}, "urandom": {1, 9}, "tty": {5, 0},
		"nvidiactl": {195, 255}, "nvidia-uvm": {235, 0}, "nvidia-uvm-tools": {235, 1},
	}
	for _, m := range strings.Split(minors, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(m), 10, 8)
		if err != nil {
			return fmt.Errorf("--stub-nvidia-minors %q: %w", minors, err)
		}
		nodes["nvidia"+strconv.FormatUint(n, 10)] = [2]uint32{195, uint32(n)}
	}
	for name, mm := range nodes {
		dev := int((mm[0] << 8) | (mm[1] & 0xff) | ((mm[1] &^ 0xff) << 12))
		if err := syscall.Mknod(filepath.Join("/dev", name), syscall.S_IFCHR|0o666, dev); err != nil {
			return fmt.Errorf("mknod /dev/%s: %w", name, err)
		}
	}
	return nil
}
