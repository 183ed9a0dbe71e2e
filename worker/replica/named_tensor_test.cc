#include "chorus/named_tensor.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace chorus {
namespace {

std::vector<std::string> Names(const std::vector<NamedTensor>& tensors) {
  std::vector<std::string> out;
  for (const NamedTensor& t : tensors) out.push_back(t.name);
  return out;
}

TEST(WithoutRepeatedTensorsTest, ATiedTensorStaysOnceUnderItsFirstName) {
  at::Tensor weight = torch::ones({2, 2});
  at::Tensor bias = torch::zeros({2});
  at::Tensor out_bias = torch::zeros({2});
  std::vector<NamedTensor> kept = WithoutRepeatedTensors({{"hidden.weight", weight},
                                                          {"hidden.bias", bias},
                                                          {"out.weight", weight},
                                                          {"out.bias", out_bias}});
  EXPECT_EQ(Names(kept), (std::vector<std::string>{"hidden.weight", "hidden.bias", "out.bias"}));
  EXPECT_TRUE(kept[0].tensor.is_same(weight));
}

TEST(WithoutRepeatedTensorsTest, EqualValuesOrSharedMemoryAreNotTheSameTensor) {
  // Only the same tensor is a repeat: a copy with equal values, or a view
  // of the same memory, is a tensor of its own.
  at::Tensor a = torch::ones({4});
  at::Tensor copy = a.clone();
  at::Tensor view = a.view({2, 2});
  std::vector<NamedTensor> kept =
      WithoutRepeatedTensors({{"a", a}, {"copy", copy}, {"view", view}});
  EXPECT_EQ(Names(kept), (std::vector<std::string>{"a", "copy", "view"}));
}

TEST(WithoutRepeatedTensorsTest, ASharedSubmoduleIsListedOnce) {
  torch::nn::Linear block(3, 3);
  torch::nn::Sequential model(block, torch::nn::Tanh(), block);
  std::vector<NamedTensor> all;
  for (const auto& item : model->named_parameters()) all.push_back({item.key(), item.value()});
  ASSERT_EQ(all.size(), 4u) << "LibTorch repeats the shared block's parameters";
  EXPECT_EQ(Names(WithoutRepeatedTensors(all)), (std::vector<std::string>{"0.weight", "0.bias"}));
}

TEST(WithoutRepeatedTensorsTest, UndefinedTensorsAreKept) {
  std::vector<NamedTensor> kept =
      WithoutRepeatedTensors({{"a", at::Tensor()}, {"b", at::Tensor()}});
  EXPECT_EQ(Names(kept), (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace chorus
