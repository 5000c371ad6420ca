# The ONNX tests run the built program (model show, import, train).
if(TARGET test_onnx)
  add_dependencies(test_onnx meshtrain)
endif()

