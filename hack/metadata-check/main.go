// Command metadata-check reads a device metadata file (KEP-5304) with the consumer library of
// Kubernetes 1.37 (k8s.io/dynamic-resource-allocation/devicemetadata), as a workload would, and
// says on one JSON line what it found:
//
//   - the version it decoded (the first it knows of the stream) and the library's validation;
//   - whether a reader that knows only v1alpha1 (1.36's library) also decodes and validates it;
//   - whether the file is byte for byte what the 1.37 kubelet plugin helper would write for the
//     same object (its encodeMetadataStream: the scheme's pretty JSON per version, v1beta1 then
//     v1alpha1, each followed by a newline).
//
// Usage: metadata-check FILE. Exit 0 when all three hold, 1 otherwise.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	runtimeserializer "k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/api/metadata/install"
	"k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	"k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: metadata-check FILE")
		os.Exit(2)
	}
	data, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	out := map[string]any{}
	var dm metadata.DeviceMetadata
	var invalid error
	var gvk schema.GroupVersionKind
	err = devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &dm,
		devicemetadata.DecodeMetadataWithValidationResult(&invalid), devicemetadata.DecodeMetadataStoreGVKResult(&gvk))
	out["decoded"], out["decode_error"], out["validation_error"] = gvk.GroupVersion().String(), errString(err), errString(invalid)

	var old v1alpha1.DeviceMetadata
	var oldInvalid error
	oldErr := devicemetadata.DecodeMetadataFromStream(json.NewDecoder(bytes.NewReader(data)), &old,
		devicemetadata.DecodeMetadataWithValidationResult(&oldInvalid))
	out["v1alpha1_error"] = errString(oldErr) + errString(oldInvalid)

	codecs := runtimeserializer.NewCodecFactory(install.NewScheme())
	info, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	var helper bytes.Buffer
	for _, gv := range []schema.GroupVersion{v1beta1.SchemeGroupVersion, v1alpha1.SchemeGroupVersion} {
		b, err := runtime.Encode(codecs.EncoderForVersion(info.PrettySerializer, gv), &dm)
		if err != nil {
			out["encode_error"] = err.Error()
		}
		helper.Write(b)
		helper.WriteByte('\n')
	}
	same := err == nil && bytes.Equal(helper.Bytes(), data)
	out["identical_to_helper"] = same
	if !same {
		out["helper_would_write"] = helper.String()
	}
	line, _ := json.Marshal(out)
	fmt.Println(string(line))
	if err != nil || invalid != nil || oldErr != nil || oldInvalid != nil || !same {
		os.Exit(1)
	}
}
